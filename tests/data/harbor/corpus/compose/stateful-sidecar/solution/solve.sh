#!/bin/bash
set -e
exec 3<>/dev/tcp/store/8000
printf 'PUT /k/status HTTP/1.0\r\nHost: store\r\nContent-Length: 4\r\n\r\ndone' >&3
head -1 <&3

#!/bin/bash
# bookworm has no curl: HTTP/1.0 over bash's /dev/tcp
set -e
hostport=${API_URL#http://}
exec 3<>"/dev/tcp/${hostport%%:*}/${hostport##*:}"
printf 'GET /token HTTP/1.0\r\nHost: api\r\n\r\n' >&3
sed '1,/^\r$/d' <&3 > /app/token.txt

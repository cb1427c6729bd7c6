#!/bin/bash
mkdir -p /logs/verifier
token=$(tr -dc '0-9a-f' < /app/token.txt 2>/dev/null)
answer=no
if [ -n "$token" ] && exec 3<>/dev/tcp/api/8000; then
    printf 'GET /check?value=%s HTTP/1.0\r\nHost: api\r\n\r\n' "$token" >&3
    answer=$(sed '1,/^\r$/d' <&3)
fi
if [ "$answer" = yes ] && [ "$API_URL" = http://api:8000 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
mkdir -p /logs/verifier
get() {
    exec 3<>/dev/tcp/store/8000 || return
    printf 'GET /k/%s HTTP/1.0\r\nHost: store\r\n\r\n' "$1" >&3
    sed '1,/^\r$/d' <&3
    exec 3<&-
}
if [ "$(get status)" = done ] && [ "$(get audit)" = seen ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

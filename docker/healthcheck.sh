#!/bin/bash
# The images' health check: GET /healthz from the coordinator's HTTP port
# with bash's /dev/tcp (no curl in the image), healthy on a 200 whose body
# says "ok". GRADSYNC_HEALTHCHECK_ADDR (HOST:PORT, default 127.0.0.1:8080)
# follows a moved --http. Works with TLS on too (see below).
addr=${GRADSYNC_HEALTHCHECK_ADDR:-127.0.0.1:8080}
host=${addr%:*}
port=${addr##*:}
exec 3<>"/dev/tcp/$host/$port" || exit 1
printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$addr" >&3
reply=$(timeout 2 cat <&3) || exit 1
case "$reply" in
  "HTTP/1."[01]" 200"*'"ok"'*) exit 0 ;;
  # With --tls-cert the port speaks only TLS, which bash cannot; the
  # coordinator's own plain-text answer to a plain request ("use https://")
  # comes from the loop that serves the port, so it shows it alive.
  "HTTP/1.1 400"*"this port speaks TLS only"*) exit 0 ;;
  *) echo "unhealthy: ${reply%%$'\r'*}" >&2; exit 1 ;;
esac

#!/usr/bin/env bash
# Sends one JSON webhook through courier by each of its three zero-code forms:
#   1. URL prefix:    POST $COURIER/$TARGET
#   2. HTTP proxy:    POST $TARGET sent to courier as a proxy (absolute-form request line)
#   3. header:        POST $COURIER/ with `Courier-Target: $TARGET`
# Each answer should be 202 with a Courier-Delivery-Id header and {"id", "event_id", "status"}.
#
#   COURIER=http://127.0.0.1:8787 TARGET=https://receiver.example/hooks ./examples/curl.sh
#
# To deliver to the example receiver on 127.0.0.1:9000 (the default TARGET), courier must
# allow loopback targets: `[egress] allow = ["127.0.0.1/32"]` in its config.
set -euo pipefail

COURIER="${COURIER:-http://127.0.0.1:8787}"
COURIER="${COURIER%/}"
TARGET="${TARGET:-http://127.0.0.1:9000/hooks}"

# -i shows courier's answer headers (Courier-Delivery-Id); --fail-with-body makes a
# non-2xx answer fail the script after printing its JSON error.
common=(-sS -i --fail-with-body -X POST -H 'Content-Type: application/json' -w '\n')
if [[ -n "${COURIER_INGRESS_TOKEN:-}" ]]; then
  common+=(-H "Courier-Token: ${COURIER_INGRESS_TOKEN}")
fi
body() { printf '{"type":"example.sent","form":"%s","data":{"hello":"world"}}' "$1"; }

echo "== 1. URL prefix" >&2
# --path-as-is keeps the embedded URL's path exactly as written; --noproxy makes the
# direct forms reach courier itself even when HTTP_PROXY points at it.
curl "${common[@]}" --noproxy '*' --path-as-is --data "$(body url-prefix)" "$COURIER/$TARGET"

echo "== 2. HTTP proxy (absolute-form)" >&2
case "$TARGET" in
  http://*)
    # Exactly what an app gets from HTTP_PROXY=$COURIER for an http:// URL
    # (--noproxy '' so that a NO_PROXY covering the target cannot bypass courier).
    curl "${common[@]}" --noproxy '' --proxy "$COURIER" --data "$(body proxy)" "$TARGET"
    ;;
  *)
    # For https:// URLs proxy-aware clients open a CONNECT tunnel, which courier refuses
    # (405: it must see the body to store and sign it), so write the request line by hand.
    curl "${common[@]}" --noproxy '*' --request-target "$TARGET" --data "$(body proxy)" "$COURIER"
    ;;
esac

echo "== 3. Courier-Target header" >&2
curl "${common[@]}" --noproxy '*' -H "Courier-Target: $TARGET" --data "$(body courier-target)" "$COURIER/"

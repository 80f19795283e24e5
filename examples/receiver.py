#!/usr/bin/env python3
r"""A webhook receiver to try courier against, in seconds: Python's standard library only
(nothing to compile). It checks Standard Webhooks, Stripe and GitHub signatures on its own
(no courier code, so it is an independent check of what courier sends), rejects signed
timestamps more than five minutes off, prints one line per request, and can fail the first
N requests to show courier's retries.

    python3 examples/receiver.py --listen 127.0.0.1:9000 --secret whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo
    python3 examples/receiver.py --fail-first 2 --fail-status 503 --retry-after 5
    python3 examples/receiver.py --secret "$(courier keys public < key.txt)"   # Ed25519

Ed25519 (the Standard Webhooks `v1a` entries that a `whpk_` public key verifies) needs the
`cryptography` package (Debian: python3-cryptography); the HMAC schemes need nothing.

courier refuses loopback targets by default: to deliver here, give courier
`[egress] allow = ["127.0.0.1/32"]` (or `allow_private_targets = true`).

Output, one line per request:
`POST /hooks id=msg_01J... scheme=standard verified=yes -> 204`
(`verified=-` when the request carries no signature or no `--secret` was given).

Checking the verification without courier: sign with Python, send with curl.

    S=whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo; B='{"type":"test"}'; T=$(date +%s)
    # standard: HMAC-SHA256(base64-decoded key, "<id>.<ts>.<body>"), base64
    SIG=$(python3 -c 'import sys,hmac,hashlib,base64;k=base64.b64decode(sys.argv[1][6:]);print(base64.b64encode(hmac.new(k,f"{sys.argv[2]}.{sys.argv[3]}.{sys.argv[4]}".encode(),hashlib.sha256).digest()).decode())' "$S" msg_1 "$T" "$B")
    curl -s -o /dev/null -w '%{http_code}\n' localhost:9000/hooks -d "$B" \
      -H 'webhook-id: msg_1' -H "webhook-timestamp: $T" -H "webhook-signature: v1,$SIG"
    # stripe: HMAC-SHA256(secret string, "<ts>.<body>"), hex
    SIG=$(python3 -c 'import sys,hmac,hashlib;print(hmac.new(sys.argv[1].encode(),f"{sys.argv[2]}.{sys.argv[3]}".encode(),hashlib.sha256).hexdigest())' "$S" "$T" "$B")
    curl -s localhost:9000/hooks -d "$B" -H 'webhook-id: msg_2' -H "Stripe-Signature: t=$T,v1=$SIG"
    # github: HMAC-SHA256(secret string, body), hex
    SIG=$(python3 -c 'import sys,hmac,hashlib;print(hmac.new(sys.argv[1].encode(),sys.argv[2].encode(),hashlib.sha256).hexdigest())' "$S" "$B")
    curl -s localhost:9000/hooks -d "$B" -H 'webhook-id: msg_3' -H "X-Hub-Signature-256: sha256=$SIG"

Each prints `verified=yes`; change a byte of the body, the secret or (for standard and
stripe) move the timestamp more than 300 s away and it prints `verified=no`.
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import http.server
import os
import sys
import threading
import time

# Larger than courier's default `max_body` (1 MiB), small enough that a stray client cannot
# exhaust memory.
MAX_BODY = 16 * 1024 * 1024


class Refused(Exception):
    """Why a signature was not accepted; printed after `verified=no`."""


def check_timestamp(ts, now, tolerance):
    """A timestamp outside the window makes a captured request useless for replay."""
    try:
        t = int(ts.strip())
    except ValueError:
        raise Refused("bad timestamp") from None
    if abs(t - now) > tolerance:
        raise Refused("timestamp outside tolerance")


def hmac_matches(key, message, expected):
    """Whether HMAC-SHA256(key, message) equals `expected`, compared in constant time."""
    return hmac.compare_digest(hmac.new(key, message, hashlib.sha256).digest(), expected)


def b64(text):
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        return None


def unhex(text):
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def header(headers, name):
    value = headers.get(name)
    if value is None:
        raise Refused("missing header")
    return value


def ed25519_keys(public):
    """The `whpk_` keys as verifiers; an error that says what to install without them."""
    if not public:
        return []
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        sys.exit("receiver: whpk_ (Ed25519) keys need the cryptography package (Debian: python3-cryptography)")
    keys = []
    for s in public:
        raw = b64(s[len("whpk_"):])
        if raw is None or len(raw) != 32:
            sys.exit(f"receiver: {s[:12]}... is not a whpk_ public key (32 bytes, base64)")
        keys.append(Ed25519PublicKey.from_public_bytes(raw))
    return keys


def verify_standard(headers, body, secrets, now, tolerance):
    """Standard Webhooks: `webhook-signature: v1,<base64> [v1a,<base64> ...]` over
    `<webhook-id>.<webhook-timestamp>.<body>`: `v1` entries are HMAC-SHA256 keyed with the
    base64 part of `whsec_...`, `v1a` entries Ed25519 signatures checked with a `whpk_...`
    public key. Any one entry matching any one key is enough (rotation)."""
    msg_id = header(headers, "webhook-id")
    ts = header(headers, "webhook-timestamp")
    check_timestamp(ts, now, tolerance)
    entries = [e.split(",", 1) for e in header(headers, "webhook-signature").split() if "," in e]
    content = f"{msg_id}.{ts}.".encode() + body
    keys = [k for k in (b64(s.removeprefix("whsec_")) for s in secrets.hmac) if k is not None]
    for version, sig in entries:
        sig = b64(sig)
        if sig is None:
            continue
        if version == "v1" and any(hmac_matches(k, content, sig) for k in keys):
            return
        if version == "v1a":
            for key in secrets.ed25519:
                try:
                    key.verify(sig, content)
                    return
                except Exception:  # cryptography's InvalidSignature, or a malformed one
                    pass
    raise Refused("no signature matches")


def verify_stripe(headers, body, secrets, now, tolerance):
    """Stripe: `Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...]` over `<ts>.<body>`, keyed
    with the secret string as is."""
    ts, signatures = None, []
    for item in header(headers, "stripe-signature").split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            ts = value
        elif name == "v1" and unhex(value) is not None:
            signatures.append(unhex(value))
    if ts is None:
        raise Refused("no t= in Stripe-Signature")
    check_timestamp(ts, now, tolerance)
    content = ts.encode() + b"." + body
    if not any(hmac_matches(k.encode(), content, s) for k in secrets.all for s in signatures):
        raise Refused("no signature matches")


def verify_github(headers, body, secrets, _now, _tolerance):
    """GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body alone, keyed with the
    secret string as is. It signs no timestamp, so there is nothing to check for age."""
    value = header(headers, "x-hub-signature-256")
    sig = unhex(value[len("sha256="):]) if value.startswith("sha256=") else None
    if sig is None:
        raise Refused("malformed X-Hub-Signature-256")
    if not any(hmac_matches(k.encode(), body, sig) for k in secrets.all):
        raise Refused("no signature matches")


# The signature scheme a request carries, recognised by its header.
SCHEMES = [
    ("webhook-signature", "standard", verify_standard),
    ("stripe-signature", "stripe", verify_stripe),
    ("x-hub-signature-256", "github", verify_github),
]


class Secrets:
    """The secrets as given, the HMAC ones apart from the Ed25519 public keys."""

    def __init__(self, given):
        self.all = given
        self.hmac = [s for s in given if not s.startswith("whpk_")]
        self.ed25519 = ed25519_keys([s for s in given if s.startswith("whpk_")])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as courier's pooled connections expect
    args = None
    secrets = None
    seen = 0
    lock = threading.Lock()

    def do_POST(self):
        self.handle_any()

    do_PUT = do_PATCH = do_DELETE = do_GET = do_POST

    def handle_any(self):
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            print(f"{self.command} {self.path} body too large -> 413", flush=True)
            self.answer(413, close=True)
            return
        body = self.rfile.read(length)
        args = self.args
        msg_id = self.headers.get("webhook-id", "-")
        scheme, verdict = "none", None
        for name, label, check in SCHEMES:
            if name in self.headers:
                scheme = label
                if args.secret:
                    try:
                        check(self.headers, body, self.secrets, int(time.time()), args.tolerance)
                        verdict = "yes"
                    except Refused as reason:
                        verdict = f"no ({reason})"
                break
        with Handler.lock:
            n = Handler.seen
            Handler.seen += 1
        failing = n < args.fail_first
        if failing:
            status = args.fail_status
        elif args.reject_unverified and verdict != "yes":
            status = 401
        else:
            status = 204
        path = self.path.split("?", 1)[0]
        print(f"{self.command} {path} id={msg_id} scheme={scheme} verified={verdict or '-'} -> {status}", flush=True)
        extra = {"Retry-After": str(args.retry_after)} if failing and args.retry_after is not None else {}
        self.answer(status, extra)

    def answer(self, status, headers=None, close=False):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        if close:
            self.send_header("Connection", "close")
        self.end_headers()

    def log_message(self, *_):
        """The one line per request above is the log."""


def main():
    p = argparse.ArgumentParser(description="A webhook receiver that verifies courier's signatures")
    p.add_argument("--listen", default="127.0.0.1:9000",
                   help="address to listen on (port 0 picks a free one; the address is printed on stderr)")
    p.add_argument("--secret", action="append", default=[],
                   help="secret to verify with, exactly as configured in courier (whsec_... for the standard "
                        "scheme; for stripe and github the string itself is the key), or for courier's whsk_ "
                        "keys the whpk_... public key that `courier keys public` prints. Repeat it, or separate "
                        "with commas, to accept several during a rotation (also RECEIVER_SECRETS)")
    p.add_argument("--fail-first", type=int, default=0,
                   help="answer the first N requests with --fail-status, to watch courier retry")
    p.add_argument("--fail-status", type=int, default=503,
                   help="the status for those failures (503 and 429 are retried with backoff; 410 dead-letters)")
    p.add_argument("--retry-after", type=int, help="send Retry-After: <seconds> with those failures")
    p.add_argument("--reject-unverified", action="store_true",
                   help="answer 401 when a signature is missing or wrong (courier then dead-letters the message "
                        "as a permanent failure), instead of logging it and answering 204")
    p.add_argument("--tolerance", type=int, default=300,
                   help="how far a signed timestamp may be from this machine's clock, in seconds")
    args = p.parse_args()
    given = args.secret or ([os.environ["RECEIVER_SECRETS"]] if os.environ.get("RECEIVER_SECRETS") else [])
    args.secret = [s.strip() for item in given for s in item.split(",") if s.strip()]
    host, _, port = args.listen.rpartition(":")
    Handler.args = args
    Handler.secrets = Secrets(args.secret)
    server = http.server.ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
    server.daemon_threads = True
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"receiver listening on http://{shown}:{bound_port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

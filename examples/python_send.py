#!/usr/bin/env python3
"""Send one JSON webhook through courier by each of its three zero-code forms.

Standard library only:

1. URL prefix: POST $COURIER/$TARGET
2. HTTP proxy: POST $TARGET sent to courier as a proxy (absolute-form request line)
3. header: POST $COURIER/ with ``Courier-Target: $TARGET``

    COURIER=http://127.0.0.1:8787 TARGET=https://receiver.example/hooks python3 examples/python_send.py

Set COURIER_INGRESS_TOKEN if courier has an ingress token. To deliver to the example
receiver on 127.0.0.1:9000 (the default TARGET), courier must allow loopback targets:
``[egress] allow = ["127.0.0.1/32"]``. Exits 1 unless all three were accepted (202).
"""

import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

COURIER = os.environ.get("COURIER", "http://127.0.0.1:8787").rstrip("/")
TARGET = os.environ.get("TARGET", "http://127.0.0.1:9000/hooks")
TOKEN = os.environ.get("COURIER_INGRESS_TOKEN")


def body(form):
    return json.dumps({"type": "example.sent", "form": form, "data": {"hello": "world"}}).encode()


def headers(extra=None):
    h = {"Content-Type": "application/json"}
    if TOKEN:
        h["Courier-Token"] = TOKEN
    h.update(extra or {})
    return h


def show(form, status, delivery_id, answer):
    print(f"{form:<15} {status} delivery_id={delivery_id or '-'} {answer.decode(errors='replace').strip()}")
    return status


def send(opener, form, url, extra=None):
    req = urllib.request.Request(url, data=body(form), headers=headers(extra), method="POST")
    try:
        with opener.open(req, timeout=10) as r:
            return show(form, r.status, r.headers.get("Courier-Delivery-Id"), r.read())
    except urllib.error.HTTPError as e:
        return show(form, e.code, None, e.read())


# The direct forms must reach courier itself, even when HTTP_PROXY points at courier.
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
statuses = []

# 1. URL prefix: the whole target URL, scheme and query included, after courier's address.
statuses.append(send(direct, "url-prefix", f"{COURIER}/{TARGET}"))

# 2. HTTP proxy: the request line carries the whole target URL (absolute-form). That is
# what urllib sends for an http:// URL when HTTP_PROXY=$COURIER is set; it is written by
# hand here so that NO_PROXY cannot bypass courier, and because for https:// URLs urllib
# would open a CONNECT tunnel, which courier refuses (405: it must see the body).
c = urllib.parse.urlsplit(COURIER)
conn = http.client.HTTPConnection(c.hostname, c.port or 80, timeout=10)
conn.request("POST", TARGET, body=body("proxy"), headers=headers({"Host": urllib.parse.urlsplit(TARGET).netloc}))
r = conn.getresponse()
statuses.append(show("proxy", r.status, r.getheader("Courier-Delivery-Id"), r.read()))
conn.close()

# 3. Courier-Target header.
statuses.append(send(direct, "courier-target", f"{COURIER}/", {"Courier-Target": TARGET}))

sys.exit(0 if all(s == 202 for s in statuses) else 1)

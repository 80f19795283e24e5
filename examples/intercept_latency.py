"""Accept latency through courier, one client (Python requests) in one run: the URL-prefix
form against an intercepted HTTPS tunnel ([intercept], CONNECT), each over a keep-alive
session, and a new tunnel per request (CONNECT + TLS handshake). See docs/benchmarks.md.

    python3 examples/intercept_latency.py COURIER_ADDR TARGET_PORT CA_FILE [N]

courier must intercept 127.0.0.1 (`[intercept] hosts = ["127.0.0.1"]`) and may leave the
messages pending (nothing needs to listen on TARGET_PORT); CA_FILE is its
`<data_dir>/intercept-ca.pem`. `verify=` is given on every request: requests lets
REQUESTS_CA_BUNDLE in the environment win over a session's own setting.
"""
import sys, time, requests
courier = sys.argv[1]        # 127.0.0.1:PORT
target_port = sys.argv[2]    # a port nothing needs to answer on (delivery retries)
ca = sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 500
body = b'{"type":"invoice.paid"}'
def run(label, session, url, **kw):
    lat = []
    for i in range(n):
        t = time.perf_counter()
        r = session.post(url, data=body, headers={"webhook-id": f"{label}-{i}"}, **kw)
        lat.append((time.perf_counter() - t) * 1e3)
        assert r.status_code == 202, r.text
    lat.sort()
    print(f"{label}: n={n} p50={lat[n//2]:.2f} ms p90={lat[int(n*.9)]:.2f} ms p99={lat[int(n*.99)]:.2f} ms rate={n/ (sum(lat)/1e3):.0f}/s")
plain = requests.Session()
run("prefix", plain, f"http://{courier}/https://127.0.0.1:{target_port}/hook")
tun = requests.Session()
tun.proxies = {"https": f"http://{courier}"}
tun.verify = ca
run("intercept", tun, f"https://127.0.0.1:{target_port}/hook", verify=ca)
# New tunnel each time: CONNECT + TLS handshake (the leaf is cached after the first).
first = []
for i in range(50):
    s = requests.Session(); s.proxies = {"https": f"http://{courier}"}; s.verify = ca
    t = time.perf_counter()
    r = s.post(f"https://127.0.0.1:{target_port}/hook", data=body, headers={"webhook-id": f"new-{i}"}, verify=ca)
    first.append((time.perf_counter() - t) * 1e3); s.close()
    assert r.status_code == 202
first.sort()
print(f"new tunnel + request: n=50 p50={first[25]:.2f} ms p90={first[45]:.2f} ms")

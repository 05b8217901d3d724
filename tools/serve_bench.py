"""Abuse figures for an OpenAI-style server (`m40 serve`, or any with the
same endpoints): the numbers issue 35 names, measured from outside.

    python3 tools/serve_bench.py URL SERVER_PID [--only stall,rss,idle,huge]

  stall  4 streams generate; a ~2,000-token prompt arrives. The streams'
         inter-token gaps that overlap its admission, against their gaps
         before (p50 and p99, ms). Start the server with a context of 4096
         or more.
  rss    8 rounds of 50 streams, each dropped after its first token; the
         server's resident memory when idle after each round.
  idle   200 connections that send nothing: how many are still open after
         30 s.
  huge   a 15.7 MB prompt: the reply's status and how long it took.

Standard library only. Speed goals live here, never in the timed tests.
"""
import http.client
import json
import socket
import statistics
import sys
import threading
import time
import urllib.parse


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=300)


def stream(url, body, on_event, stop_after=None):
    c = conn(url)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    n = 0
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                break
            on_event(time.monotonic())
            n += 1
            if stop_after and n >= stop_after:
                break
    c.close()


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def stall(url):
    times = [[] for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(url, {"prompt": "Once upon a time", "max_tokens": 600,
                                                            "temperature": 0}, times[i].append))
               for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(4)
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 200  # ~2,000 tokens
    start = time.monotonic()
    c = conn(url)
    c.request("POST", "/v1/completions", json.dumps({"prompt": long_prompt, "max_tokens": 1}),
              {"Content-Type": "application/json"})
    reply = json.loads(c.getresponse().read())
    end = time.monotonic()
    for t in threads:
        t.join()
    idle, during = [], []
    for ts in times:
        for a, b in zip(ts, ts[1:]):
            gap = (b - a) * 1000
            if b < start - 0.5 and a > ts[0] + 1:
                idle.append(gap)
            elif b > start and a < end:  # the gap overlaps the admission
                during.append(gap)
    print(f"stall: a {reply['usage']['prompt_tokens']}-token prompt admitted in {end - start:.2f} s while 4 streams ran")
    print(f"stall: idle gaps p50 {statistics.median(idle):.1f} ms, p99 {percentile(idle, 99):.1f} ms ({len(idle)} gaps)")
    if during:
        print(f"stall: gaps while admitting p50 {statistics.median(during):.1f} ms, p99 {percentile(during, 99):.1f} ms, "
              f"max {max(during):.1f} ms ({len(during)} gaps); p99 / idle p99 = "
              f"{percentile(during, 99) / percentile(idle, 99):.2f}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


def wait_idle(url):
    for _ in range(600):
        c = conn(url)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        if r.status != 200:  # a server without metrics: give it time
            time.sleep(3)
            return
        if "m40_active_sessions 0" in text and "m40_queue_length 0" in text:
            return
        time.sleep(0.1)


def rss(url, pid):
    sizes = []
    for round_ in range(8):
        threads = [threading.Thread(target=stream, args=(url, {"prompt": f"Story {i}: once upon a time",
                                                                "max_tokens": 50}, lambda t: None, 1))
                   for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_idle(url)
        time.sleep(1)
        sizes.append(rss_kib(pid))
        print(f"rss: after round {round_ + 1}: {sizes[-1] / 1024:.0f} MiB")
    print(f"rss: last / first = {sizes[-1] / sizes[0]:.2f}")


def idle(url):
    u = urllib.parse.urlparse(url)
    socks = [socket.create_connection((u.hostname, u.port)) for _ in range(200)]
    time.sleep(30)
    open_ = 0
    for s in socks:
        s.setblocking(False)
        try:
            open_ += s.recv(1) != b""  # b"": closed by the server
        except BlockingIOError:
            open_ += 1
        except OSError:
            pass
        s.close()
    print(f"idle: {open_} of 200 silent connections still open after 30 s")


def huge(url):
    body = json.dumps({"prompt": "word " * 3_140_000, "max_tokens": 1})  # 15.7 MB
    start = time.monotonic()
    c = conn(url)
    try:
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        status, text = r.status, r.read()[:160]
    except OSError as e:
        status, text = "connection closed", str(e)
    print(f"huge: a {len(body) / 1e6:.1f} MB prompt: {status} after {time.monotonic() - start:.2f} s: {text}")


def main():
    url, pid = sys.argv[1], int(sys.argv[2])
    only = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[3] == "--only" else ["stall", "rss", "idle", "huge"]
    for name in only:
        {"stall": lambda: stall(url), "rss": lambda: rss(url, pid), "idle": lambda: idle(url),
         "huge": lambda: huge(url)}[name]()


if __name__ == "__main__":
    main()

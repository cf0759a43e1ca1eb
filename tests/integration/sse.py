"""Server-Sent Events as `msaflow serve` sends them (docs/service.md), read from an
http.client response: the tests' and bench/serve_bench.py's one parser."""


def sse_events(response):
    """Yields each event of the stream as a dict of its fields ("id", "event", "data", ...),
    until the server closes it; comments (": keep-alive") and `retry:` lines are skipped."""
    block = {}
    while True:
        line = response.fp.readline()
        if not line:
            return
        line = line.decode().rstrip("\n")
        if line == "":
            if "data" in block:
                yield block
            block = {}
        elif not line.startswith(":") and ": " in line:
            key, value = line.split(": ", 1)
            block[key] = value

#!/usr/bin/env python3
"""Helpers of bench/tui.sh (standard library only).

  bench.py script --steps N --out PATH          the scripted model of the long thread: N model
                                                turns of one tool call each (write_file and
                                                read_file of ~1.8 KB files, alternating), then
                                                a text answer
  bench.py script --steps 0 --out PATH          the short thread: one text answer
  bench.py fixtures --chars C --chunk-size K --latency MS
                                                aimock fixtures (JSON on stdout): a message
                                                containing STREAM_MARK or KEYS_MARK gets a
                                                C-character markdown answer streamed in
                                                K-character chunks MS ms apart
  bench.py turn --session S --pid P --aimock-log F --message TEXT
                                                types TEXT + Enter into the TUI in tmux
                                                session S and times the turn (JSON on stdout):
                                                CPU of process P from Enter until the request
                                                reaches aimock (its debug log says a fixture
                                                matched), from there until the answer's last
                                                words are on screen, and until 1 s after the
                                                turn is over
  bench.py idle --pid P --seconds S             CPU of process P over S seconds (JSON)
  bench.py keys --session S --aimock-log F --message TEXT --probes N
                                                sends TEXT, and while the answer streams types
                                                one character N times, each time timing how
                                                long until capture-pane shows it (then erases
                                                it); JSON with the latencies in ms
  bench.py request --url URL                    the last request aimock answered: its status,
                                                its size in bytes and (up to 64 KB) messages
  bench.py report --results F --tokens T --idle S
                                                the table of bench/tui.sh from the JSON lines
                                                of F (medians over repetitions)

tmux runs on the socket named by $BENCH_TMUX_SOCKET (tmux -L) when it is set.
CPU is utime+stime of /proc/P/stat (all threads of the process), in clock ticks (10 ms at
CLK_TCK 100), reported in ms.
"""

import argparse
import json
import os
import subprocess
import sys
import time

STREAM_MARK = "bench-tui-stream"
KEYS_MARK = "bench-tui-keys"
END_MARK = "BENCH-TUI-END"
WORKING = "working · Esc interrupts"
TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")

WORDS = (
    "the terminal view wraps each cell once and keeps its lines by width so a frame "
    "copies only what shows while the stream of deltas grows the last cell of the "
    "conversation and nothing else is drawn again between two ticks of the clock"
).split()


def answer_text(chars):
    """A deterministic markdown answer of about `chars` characters ending with END_MARK."""
    out, size, n = [], 0, 0
    while size < chars - 200:
        n += 1
        if n % 7 == 0:
            para = "\n".join(
                f"- item {n}.{k}: `value_{k}` is **{WORDS[(n + k) % len(WORDS)]}**"
                for k in range(5)
            )
        elif n % 11 == 0:
            para = f"## Section {n}"
        else:
            words = [WORDS[(n * 7 + k * 3) % len(WORDS)] for k in range(70)]
            para = " ".join(words).capitalize() + "."
        out.append(para)
        size += len(para) + 2
    out.append(f"That is all. {END_MARK}")
    return "\n\n".join(out)


def file_content(i):
    lines = [f"file {i} line {k}: " + " ".join(WORDS[(i + k + j) % len(WORDS)] for j in range(8))
             for k in range(30)]
    return "\n".join(lines) + "\n"


def cmd_script(args):
    turns = []
    for i in range(args.steps):
        path = f"/notes/f{i // 2:04d}.txt"
        if i % 2 == 0:
            call = {"name": "write_file", "args": {"file_path": path, "content": file_content(i // 2)}}
        else:
            call = {"name": "read_file", "args": {"file_path": path}}
        turns.append({"text": f"Step {i}.", "tool_calls": [call]})
    turns.append({"text": f"Done after {args.steps} tool calls."})
    with open(args.out, "w") as f:
        json.dump({"turns": turns}, f)


def cmd_fixtures(args):
    text = answer_text(args.chars)
    fixtures = [
        {
            "match": {"userMessage": mark},
            "response": {"content": text},
            "latency": args.latency,
            "chunkSize": args.chunk_size,
        }
        for mark in (STREAM_MARK, KEYS_MARK)
    ]
    json.dump({"fixtures": fixtures}, sys.stdout)
    print()


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def tmux(*args):
    socket = ["-L", os.environ["BENCH_TMUX_SOCKET"]] if os.environ.get("BENCH_TMUX_SOCKET") else []
    return subprocess.run(["tmux", *socket, *args], capture_output=True, text=True, check=False).stdout


def screen(session):
    return tmux("capture-pane", "-p", "-t", session)


def log_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def wait_request(log, size0, deadline):
    """Until aimock (at --log-level debug) logs past size0 that a request matched a fixture."""
    while time.monotonic() < deadline:
        if log_size(log) > size0:
            with open(log, "rb") as f:
                f.seek(size0)
                if b"Fixture matched" in f.read():
                    return True
        time.sleep(0.002)
    return False


def wait_screen(session, pred, deadline, every=0.05):
    while time.monotonic() < deadline:
        s = screen(session)
        if pred(s):
            return s
        time.sleep(every)
    return None


def send_message(session, text):
    tmux("send-keys", "-t", session, "-l", text)
    time.sleep(0.3)  # let the input draw it before Enter


def cmd_turn(args):
    send_message(args.session, args.message)
    size0 = log_size(args.aimock_log)
    c0, t0 = ticks(args.pid), time.monotonic()
    tmux("send-keys", "-t", args.session, "Enter")
    if not wait_request(args.aimock_log, size0, t0 + args.timeout):
        sys.exit(f"error: the request never reached aimock:\n{screen(args.session)}")
    c1, t1 = ticks(args.pid), time.monotonic()
    if wait_screen(args.session, lambda s: END_MARK in s, t1 + args.timeout) is None:
        sys.exit(f"error: the answer's end never showed:\n{screen(args.session)}")
    c2, t2 = ticks(args.pid), time.monotonic()
    if wait_screen(args.session, lambda s: WORKING not in s, t2 + args.timeout, 0.02) is None:
        sys.exit(f"error: the turn never ended:\n{screen(args.session)}")
    time.sleep(1)
    c3, t3 = ticks(args.pid), time.monotonic()
    json.dump(
        {
            "request_cpu_ms": (c1 - c0) * TICK_MS,
            "request_wall_s": t1 - t0,
            "stream_cpu_ms": (c2 - c1) * TICK_MS,
            "stream_wall_s": t2 - t1,
            "finish_cpu_ms": (c3 - c2) * TICK_MS,
            "finish_wall_s": t3 - t2,
        },
        sys.stdout,
    )
    print()


def cmd_idle(args):
    c0, t0 = ticks(args.pid), time.monotonic()
    time.sleep(args.seconds)
    c1, t1 = ticks(args.pid), time.monotonic()
    json.dump({"idle_cpu_ms": (c1 - c0) * TICK_MS, "idle_wall_s": t1 - t0}, sys.stdout)
    print()


def input_line(s):
    """The text of the input box: the line after its top border `┌ message …`."""
    lines = s.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("┌") and k + 1 < len(lines):
            return lines[k + 1]
    return ""


def cmd_keys(args):
    send_message(args.session, args.message)
    size0 = log_size(args.aimock_log)
    tmux("send-keys", "-t", args.session, "Enter")
    if not wait_request(args.aimock_log, size0, time.monotonic() + args.timeout):
        sys.exit(f"error: the request never reached aimock:\n{screen(args.session)}")
    time.sleep(0.5)
    lat = []
    for _ in range(args.probes):
        if END_MARK in screen(args.session):
            break
        t0 = time.monotonic()
        tmux("send-keys", "-t", args.session, "-l", "Q")
        if wait_screen(args.session, lambda s: "Q" in input_line(s), t0 + 10, 0.0) is None:
            sys.exit(f"error: the typed key never showed:\n{screen(args.session)}")
        lat.append((time.monotonic() - t0) * 1000)
        tmux("send-keys", "-t", args.session, "BSpace")
        wait_screen(args.session, lambda s: "Q" not in input_line(s), time.monotonic() + 10, 0.01)
        time.sleep(args.every)
    streaming = END_MARK not in screen(args.session)
    wait_screen(args.session, lambda s: END_MARK in s and WORKING not in s,
                time.monotonic() + args.timeout)
    json.dump({"key_ms": lat, "still_streaming_after_probes": streaming}, sys.stdout)
    print()


def cmd_request(args):
    import urllib.request

    with urllib.request.urlopen(args.url.rstrip("/") + "/__aimock/journal", timeout=60) as resp:
        journal = json.load(resp)
    if not journal:
        sys.exit("error: aimock's journal is empty")
    entry = journal[-1]
    body = entry.get("body") or {}
    if body.get("__aimock_truncated"):  # aimock keeps bodies up to 64 KB, else only the size
        size, messages = body.get("originalByteSize"), None
    else:
        size, messages = len(json.dumps(body).encode()), len(body.get("messages") or [])
    json.dump(
        {"status": (entry.get("response") or {}).get("status"), "messages": messages,
         "request_bytes": size},
        sys.stdout,
    )
    print()


def median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def cmd_report(args):
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    per_1k = args.tokens / 1000.0

    def metric(case, fn):
        vals = [fn(r) for r in rows if r["case"] == case]
        vals = [v for v in vals if v is not None]
        return median(vals)

    def keys(r, q):
        lat = sorted(r.get("key_ms") or [])
        if not lat:
            return None
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    table = [
        ("the request the TUI sent to the model (KB of JSON)", None),
        ("CPU to open the thread and draw it (ms)", lambda r: r.get("open_cpu_ms")),
        ("CPU from Enter to the request (ms)", lambda r: r.get("request_cpu_ms")),
        ("**CPU while the answer streams (ms per 1,000 tokens)**",
         lambda r: r.get("stream_cpu_ms") / per_1k if "stream_cpu_ms" in r else None),
        ("streaming wall time, request to last words on screen (s)", lambda r: r.get("stream_wall_s")),
        ("CPU from the last words to 1 s after the turn's end (ms)", lambda r: r.get("finish_cpu_ms")),
        (f"idle CPU over {args.idle:g} s after the answer (%)",
         lambda r: r["idle_cpu_ms"] / (r["idle_wall_s"] * 1000) * 100 if "idle_cpu_ms" in r else None),
        ("key to screen while streaming, p50 (ms)", lambda r: keys(r, 0.5)),
        ("key to screen while streaming, max (ms)", lambda r: keys(r, 1.0)),
    ]
    print("| measure | short thread | long thread | long / short |")
    print("|---|---|---|---|")
    for label, fn in table:
        if fn is None:
            cells = []
            for case in ("short", "long"):
                b = metric(case, lambda r: r.get("request_bytes"))
                cells.append("-" if b is None else f"{b / 1024:.0f}")
            print(f"| {label} | {cells[0]} | {cells[1]} | |")
            continue
        a, b = metric("short", fn), metric("long", fn)
        fmt = (lambda v: "-" if v is None else (f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}"))
        ratio = f"{b / a:.2f}x" if a and b is not None else "-"
        print(f"| {label} | {fmt(a)} | {fmt(b)} | {ratio} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(required=True)
    s = sub.add_parser("script")
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_script)
    s = sub.add_parser("fixtures")
    s.add_argument("--chars", type=int, required=True)
    s.add_argument("--chunk-size", type=int, required=True)
    s.add_argument("--latency", type=int, required=True)
    s.set_defaults(func=cmd_fixtures)
    for name, func in (("turn", cmd_turn), ("keys", cmd_keys)):
        s = sub.add_parser(name)
        s.add_argument("--session", required=True)
        s.add_argument("--aimock-log", required=True)
        s.add_argument("--message", required=True)
        s.add_argument("--timeout", type=float, default=600)
        s.set_defaults(func=func)
        if name == "turn":
            s.add_argument("--pid", type=int, required=True)
        else:
            s.add_argument("--probes", type=int, default=20)
            s.add_argument("--every", type=float, default=0.2)
    s = sub.add_parser("idle")
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--seconds", type=float, required=True)
    s.set_defaults(func=cmd_idle)
    s = sub.add_parser("request")
    s.add_argument("--url", required=True)
    s.set_defaults(func=cmd_request)
    s = sub.add_parser("report")
    s.add_argument("--results", required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--idle", type=float, required=True)
    s.set_defaults(func=cmd_report)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()

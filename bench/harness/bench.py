"""Helpers of bench/harness.sh (standard library only).

  bench.py fixtures --n N                  print the aimock fixtures of an N-step run (JSON)
  bench.py load --url URL --n N            reset aimock (fixtures and journal), load those
  bench.py check --url URL --n N           verify the run against aimock's request journal
  bench.py table --results TSV --out MD    the summary table (markdown), also on stdout

The workload: one user message, then N model turns, each answering with exactly one tool call,
cycling over six filesystem tools on small files (k = i // 6, a new file per cycle: our
write_file is create-only; Python deepagents 0.7.32's StateBackend.write overwrites, so a new
file keeps the two doing the same), then a final text answer.

Matching: turn i's fixture matches only a request with exactly i assistant messages
(turnIndex, strict: aimock runs with AIMOCK_STRICT_TURN_INDEX=1) whose LAST message is the
result of tool call `call_{i-1}` and contains the text that call must produce. Guard fixtures
registered first answer HTTP 400 to any request whose last tool result carries error text, so a
tool error ends the run and shows in the journal. A request that matches nothing gets aimock's
404. Every answer is a fixed fixture, so turn i gets tool call i whichever harness asks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import urllib.request

# Kept in step with bench/harness/run_python.py and the `deepagents run` call in harness.sh.
TASK = "Run the harness benchmark: follow the tool calls you are given. [harness-bench]"
MARK = "[harness-bench]"

# Text that no successful result of this workload contains, and errors of both harnesses do.
ERROR_MARKERS = [
    "rror",  # Error, error
    "RROR",
    "not found",
    "already exists",
    "nvalid",  # Invalid, invalid
    "denied",
    "ailed",  # Failed, failed
    "cannot",
    "Cannot",
]


def step(i):
    """Tool call i: (name, arguments, text its result must contain)."""
    k = i // 6
    path = f"/f{k}.txt"
    return [
        ("write_file", {"file_path": path, "content": f"hello {k}\n"}, path),
        ("read_file", {"file_path": path}, f"hello {k}"),
        ("edit_file", {"file_path": path, "old_string": "hello", "new_string": "bye"}, path),
        ("ls", {"path": "/"}, path),
        ("grep", {"pattern": "bye"}, path),  # the file just edited matches
        ("glob", {"pattern": "*.txt"}, f"f{k}.txt"),
    ][i % 6]


def final_answer(n):
    return f"Done: {n} tool calls."


def fixtures(n):
    out = []
    for marker in ERROR_MARKERS:
        out.append(
            {
                "match": {"toolResultContains": marker},
                "response": {
                    "error": {
                        "message": f"harness bench: the last tool result has error text ({marker!r})",
                        "type": "invalid_request_error",
                    },
                    "status": 400,
                },
                "metadata": {"guard": marker},
            }
        )
    for i in range(n + 1):
        if i == 0:
            match = {"userMessage": MARK, "turnIndex": 0}
        else:
            match = {
                "toolCallId": f"call_{i - 1}",
                "toolResultContains": step(i - 1)[2],
                "turnIndex": i,
            }
        if i < n:
            name, arguments, _ = step(i)
            response = {"toolCalls": [{"id": f"call_{i}", "name": name, "arguments": arguments}]}
        else:
            response = {"content": final_answer(n)}
        out.append({"match": match, "response": response, "metadata": {"turn": i}})
    return out


def request(url, method="GET", body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, resp.read()


def cmd_fixtures(args):
    json.dump({"fixtures": fixtures(args.n)}, sys.stdout, indent=1)
    print()


def cmd_load(args):
    base = args.url.rstrip("/")
    request(base + "/__aimock/reset", "POST", {})
    status, _ = request(base + "/__aimock/fixtures", "POST", {"fixtures": fixtures(args.n)})
    if status != 200:
        sys.exit(f"error: aimock refused the fixtures (HTTP {status})")
    _, body = request(base + "/__aimock/fixtures")
    count = json.loads(body)["count"]
    want = len(ERROR_MARKERS) + args.n + 1
    if count != want:
        sys.exit(f"error: aimock holds {count} fixtures, expected {want}")


def tool_messages_problem(messages, i):
    """For a journaled body small enough to be kept whole: the conversation so far is right."""
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if len(assistants) != i:
        return f"{len(assistants)} assistant messages, expected {i}"
    tools = [m for m in messages if m.get("role") == "tool"]
    if len(tools) != i:
        return f"{len(tools)} tool messages, expected {i}"
    for j, m in enumerate(tools):
        if m.get("tool_call_id") != f"call_{j}":
            return f"tool message {j} answers {m.get('tool_call_id')!r}, expected 'call_{j}'"
        text = m.get("content")
        if isinstance(text, list):
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        text = text if isinstance(text, str) else ""
        for marker in ERROR_MARKERS:
            if marker in text:
                return f"tool result {j} has error text ({marker!r}): {text[:200]!r}"
        if step(j)[2] not in text:
            return f"tool result {j} lacks {step(j)[2]!r}: {text[:200]!r}"
    return None


def cmd_check(args):
    """Exit 0 and print a one-line summary when the journal holds exactly the expected run."""
    base = args.url.rstrip("/")
    _, body = request(base + "/__aimock/journal")
    entries = json.loads(body)
    n = args.n
    problems = []
    if len(entries) != n + 1:
        problems.append(f"{len(entries)} requests in the journal, expected {n + 1}")
    streamed = set()
    whole = 0
    largest = 0
    for i, entry in enumerate(entries[: n + 1]):
        resp = entry.get("response") or {}
        fixture = resp.get("fixture") or {}
        meta = fixture.get("metadata") or {}
        where = f"request {i}"
        if not entry.get("path", "").split("?")[0].endswith("/chat/completions"):
            problems.append(f"{where}: path {entry.get('path')!r}")
        if resp.get("status") != 200:
            guard = f" (guard {meta['guard']!r}: a tool error)" if "guard" in meta else ""
            problems.append(f"{where}: HTTP {resp.get('status')}{guard}")
        elif meta.get("turn") != i:
            problems.append(f"{where}: answered by the fixture of turn {meta.get('turn')}")
        req = entry.get("body") or {}
        if req.get("__aimock_truncated"):
            largest = max(largest, int(req.get("originalByteSize", 0)))
            continue
        whole += 1
        largest = max(largest, len(json.dumps(req)))
        streamed.add(bool(req.get("stream")))
        if req.get("model") != "gpt-4o":
            problems.append(f"{where}: model {req.get('model')!r}")
        problem = tool_messages_problem(req.get("messages") or [], i)
        if problem:
            problems.append(f"{where}: {problem}")
        if len(problems) > 10:
            break
    if problems:
        print("journal check FAILED: " + "; ".join(problems[:10]), file=sys.stderr)
        sys.exit(1)
    mode = {frozenset([True]): "streaming", frozenset([False]): "non-streaming"}.get(
        frozenset(streamed), "mixed"
    )
    print(
        f"journal ok: {n + 1} requests in order, all answered 200, {mode}, "
        f"{whole} bodies checked whole, largest request {largest} bytes"
    )


def median(values):
    return statistics.median(values) if values else None


def cmd_table(args):
    """Results TSV: harness, n, rep, status, cpu_s, rss_kb, db_bytes, other_cpu_s, disturbed."""
    rows = []
    with open(args.results) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            rows.append(parts)
    sizes = sorted({int(r[1]) for r in rows})
    by = {}
    failed = {}
    dbs = {}
    disturbed = 0
    for harness, n, _rep, status, cpu, rss, *rest in rows:
        n = int(n)
        if len(rest) > 2 and rest[2] == "1":
            disturbed += 1
        if status != "ok":
            failed[(harness, n)] = failed.get((harness, n), 0) + 1
            continue
        by.setdefault((harness, n), []).append((float(cpu), int(rss)))
        if rest and rest[0]:
            dbs.setdefault((harness, n), []).append(int(rest[0]))

    def med(harness, n, idx):
        vals = [v[idx] for v in by.get((harness, n), [])]
        return median(vals)

    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    lines = []
    lines.append(
        "| N | ours CPU ms | python CPU ms | CPU python/ours | ours RSS MB | python RSS MB "
        "| RSS python/ours | runs ok (ours, python) |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---|")
    cpu_ours = {}
    for n in sizes:
        oc, pc = med("ours", n, 0), med("python", n, 0)
        orss, prss = med("ours", n, 1), med("python", n, 1)
        oc_ms = None if oc is None else oc * 1000
        pc_ms = None if pc is None else pc * 1000
        cpu_ours[n] = oc_ms
        o_mb = None if orss is None else orss / 1024
        p_mb = None if prss is None else prss / 1024
        ok = []
        for h in ("ours", "python"):
            good = len(by.get((h, n), []))
            bad = failed.get((h, n), 0)
            ok.append(f"{good}" + (f" ({bad} failed)" if bad else ""))
        lines.append(
            f"| {n} | {fmt(oc_ms, '.1f')} | {fmt(pc_ms, '.0f')} | {fmt(ratio(pc_ms, oc_ms), '.0f')} "
            f"| {fmt(o_mb, '.1f')} | {fmt(p_mb, '.1f')} | {fmt(ratio(p_mb, o_mb), '.1f')} "
            f"| {', '.join(ok)} |"
        )
    lines.append("")
    for a, b in ((10, 50), (200, 1000)):
        for h in ("ours", "python"):
            ca, cb = med(h, a, 0), med(h, b, 0)
            if ca is not None and cb is not None:
                lines.append(
                    f"- marginal CPU per extra step, {h}, N={a}→{b}: "
                    f"{(cb - ca) * 1000 / (b - a):.3f} ms/step"
                )
    if disturbed:
        lines.append(
            f"- warning: {disturbed} of {len(rows)} runs shared the CPU with other processes "
            "(columns other_cpu_s and disturbed of the raw TSV); their timings are disturbed"
        )
    db_sizes = sorted(n for (h, n) in dbs if h == "ours-thread")
    if db_sizes:
        lines.append("")
        lines.append("| N | ours --thread CPU ms | ours --thread RSS MB | store.db bytes | bytes/step |")
        lines.append("|---:|---:|---:|---:|---:|")
        for n in db_sizes:
            c, r = med("ours-thread", n, 0), med("ours-thread", n, 1)
            db = median(dbs[("ours-thread", n)])
            lines.append(
                f"| {n} | {fmt(None if c is None else c * 1000, '.1f')} "
                f"| {fmt(None if r is None else r / 1024, '.1f')} | {db:.0f} | {db / n:.0f} |"
            )
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(args.header.replace("\\n", "\n") if args.header else "")
            f.write(text)


def cmd_time(args):
    """Runs the command under /usr/bin/time and writes `user_s sys_s maxrss_kb`: the CPU from
    the rusage wait4 returns for /usr/bin/time (its own ~0.5 ms plus the command's, in
    microseconds, where /usr/bin/time prints 10 ms steps), the peak RSS as /usr/bin/time
    measured it (a process forked from Python would start from Python's). Exits as it did."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    rss_file = args.output + ".rss"
    child = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss_file, *command])
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = 0  # reaped here; keep Popen from waiting for it again
    with open(rss_file) as f:
        rss = f.read().strip().splitlines()[-1]
    os.unlink(rss_file)
    with open(args.output, "w") as f:
        f.write(f"{usage.ru_utime:.6f} {usage.ru_stime:.6f} {rss}\n")
    code = os.waitstatus_to_exitcode(status)
    sys.exit(code if code >= 0 else 128 - code)


def launched_cpu(command):
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0
    return usage.ru_utime + usage.ru_stime


def cmd_calibrate(_args):
    """Prints the CPU seconds /usr/bin/time itself adds to a run: the median of 21 runs of
    /bin/true under it, less the median of 21 runs of /bin/true alone."""
    timed = statistics.median(
        launched_cpu(["/usr/bin/time", "-f", "%M", "-o", "/dev/null", "/bin/true"]) for _ in range(21)
    )
    alone = statistics.median(launched_cpu(["/bin/true"]) for _ in range(21))
    print(f"{max(0.0, timed - alone):.6f}")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fixtures")
    p.add_argument("--n", type=int, required=True)
    p.set_defaults(func=cmd_fixtures)
    for name, func in (("load", cmd_load), ("check", cmd_check)):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True)
        p.add_argument("--n", type=int, required=True)
        p.set_defaults(func=func)
    p = sub.add_parser("time")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_time)
    p = sub.add_parser("calibrate")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("table")
    p.add_argument("--results", required=True)
    p.add_argument("--out")
    p.add_argument("--header", default="")
    p.set_defaults(func=cmd_table)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()

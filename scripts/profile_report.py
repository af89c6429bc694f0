#!/usr/bin/env python3
"""Summaries for scripts/profile.sh (issue #15): where an agent's CPU goes.

  profile_report.py callgrind OUT ROUNDS [TOP]   inclusive instruction counts by function
  profile_report.py strace DIR AGENT ROUNDS [TOP] syscalls of the agent's own threads (strace -ff)
  profile_report.py perf DATA AGENT [TOP]         cpu-clock samples of the agent's threads by cost

Only the agent is counted: its MCP server children (and their threads) are left out, as the
benchmark leaves out their CPU.
"""
import collections
import os
import re
import subprocess
import sys

# Frames every sample passes through (thread entry, runtime loops): not cost centres.
WRAPPERS = re.compile(
    r"start_thread|clone3?\.S|__rust_begin_short_backtrace|below main|__libc_start|^main$|"
    r"0x[0-9a-f]+$|block_on|FnOnce::call_once|lifecycle|PROGRAM TOTALS|"
    r"^buzz_agent(_smol)?::(main|run::\{\{closure\}\})$"
)


def callgrind(out, rounds, top=25):
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", out],
        capture_output=True, text=True, check=True,
    ).stdout
    total = int(re.search(r"([\d,]+) \([\d.]+%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
    best = {}
    for m in re.finditer(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:[^:\n]*:)?(.+?)(?: \[[^\]]*\])?$", text, re.M):
        ir, name = int(m.group(1).replace(",", "")), m.group(2).strip()
        name = re.sub(r"'\d+$", "", re.sub(r" \(\d+x\)$", "", name))  # recursion, call counts
        if WRAPPERS.search(name) or ir > total:
            continue
        best[name] = max(best.get(name, 0), ir)
    print(f"  instructions: {total:,} ({total / rounds:,.0f} per round)")
    print("  inclusive cost by function (a function inlined into others is counted where it is):")
    for name, ir in sorted(best.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * ir / total:5.1f}%  {ir / rounds:>9,.0f}/round  {name[:110]}")


def strace(d, agent, rounds, top=20):
    files = {}
    for f in os.listdir(d):
        with open(os.path.join(d, f), errors="replace") as fh:
            files[int(f.rsplit(".", 1)[-1])] = fh.read()
    main = next(t for t, x in files.items() if re.match(r'execve\("[^"]*/' + re.escape(agent) + '"', x))
    # The agent's threads: what its own threads cloned with CLONE_THREAD (children exec'd MCP
    # servers are processes, not threads, and are left out with their own threads).
    ours, todo = set(), [main]
    while todo:
        t = todo.pop()
        ours.add(t)
        for m in re.finditer(r"^clone3?\(\{?flags=([A-Z_|]+).*?= (\d+)$", files.get(t, ""), re.M):
            if "CLONE_THREAD" in m.group(1) and int(m.group(2)) not in ours:
                todo.append(int(m.group(2)))
    counts = collections.Counter()
    for t in ours:
        for line in files.get(t, "").splitlines():
            m = re.match(r"^([a-z_0-9]+)\(", line)
            if m:
                counts[m.group(1)] += 1
    total = sum(counts.values())
    print(f"  {len(ours)} threads (main + {len(ours) - 1} started), "
          f"{total} syscalls ({total / rounds:.1f} per round)")
    for name, n in counts.most_common(top):
        print(f"  {name:18} {n:7} {n / rounds:7.2f}/round")
    for name in ("clone3", "connect", "futex", "epoll_wait", "epoll_pwait", "epoll_ctl"):
        if name not in dict(counts.most_common(top)) and counts[name]:
            print(f"  {name:18} {counts[name]:7} {counts[name] / rounds:7.2f}/round")


# Kernel cost centres, matched on the whole call chain in this order.
KERNEL = [
    ("page faults", r"exc_page_fault"),
    ("futex (thread wake/wait, locks)", r"futex"),
    ("eventfd (runtime wake-ups)", r"eventfd_"),
    ("pipe write (ACP stdout, MCP stdin)", r"anon_pipe_write|pipe_write"),
    ("pipe read (ACP stdin, MCP stdout)", r"pipe_read"),
    ("TCP connect/close", r"__sys_connect|tcp_v4_connect|tcp_close|__x64_sys_close|__x64_sys_socket"),
    ("TCP send (with loopback delivery)", r"tcp_sendmsg|__sys_sendto"),
    ("TCP receive", r"tcp_recvmsg|__sys_recvfrom"),
    ("thread create/exit (clone3, stacks)",
     r"clone3|ret_from_fork|do_exit|__x64_sys_exit|munmap|mprotect|madvise|__x64_sys_mmap|"
     r"set_robust_list|rseq|sigaltstack|rt_sigprocmask|sched_getaffinity|prctl"),
    ("event loop (epoll, timerfd)", r"epoll|timerfd"),
    ("context switches on return to user", r"exit_to_user_mode_loop|__schedule"),
]


def perf(data, agent, top=12):
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    samples = []
    for block in out.split("\n\n"):
        lines = block.strip("\n").split("\n")
        m = re.match(r"\s*(.+?)\s+(\d+)/(\d+)", lines[0]) if lines and lines[0] else None
        if m:
            samples.append((m.group(1), int(m.group(2)), [l.strip() for l in lines[1:]]))
    agent_pid = min(p for c, p, _ in samples if c == agent)
    mine = [s for s in samples if s[1] == agent_pid]
    cats, leaf = collections.Counter(), collections.Counter()
    for _, _, frames in mine:
        chain = " ".join(frames)
        if "[kernel.kallsyms]" in chain:
            cat = next((f"kernel: {n}" for n, rx in KERNEL if re.search(rx, chain)), "kernel: other")
        else:
            m = re.match(r"\S+ (.*) \((.*)\)$", frames[0]) if frames else None
            sym, dso = (m.group(1), os.path.basename(m.group(2))) if m else ("?", "?")
            cat = f"user: {dso}"
            leaf[f"{re.sub(r'[+]0x[0-9a-f]+$', '', sym)[:90]} [{dso}]"] += 1
        cats[cat] += 1
    n = len(mine)
    print(f"  {n} samples of the agent's threads (pid {agent_pid})")
    for c, k in cats.most_common():
        print(f"  {100 * k / n:5.1f}%  {c}")
    print("  user-space leaf functions (no frame pointers: callers are callgrind's job):")
    for c, k in leaf.most_common(top):
        print(f"  {100 * k / n:5.1f}%  {c}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "callgrind":
        callgrind(args[0], int(args[1]), *map(int, args[2:3]))
    elif cmd == "strace":
        strace(args[0], args[1], int(args[2]), *map(int, args[3:4]))
    elif cmd == "perf":
        perf(args[0], args[1], *map(int, args[2:3]))
    else:
        sys.exit(__doc__)

#!/usr/bin/env python3
"""Host-side helpers of the stock-kernel rig (e2e/kernel/rig).

patch-interp SRC DST INTERP   copy an ELF64 executable, rewriting its PT_INTERP string in place
report --expected FILE --out DIR (--vm NAME CONSOLE STATUS)...
                              read the guests' protocol lines, print a table per kernel, write summary.json and
                              junit.xml to DIR, exit 1 when a test failed, had no result, or a VM died

The guest protocol (written by the isthmus-kernel-tests binary on the serial console):
  ISTHMUS-RESULT {"test":..,"kernel":..,"backend":..,"verdict":"pass|fail|skip","duration_ms":..,
                  "summary":..,"output":..,"measurements":{..}}      one line per test
  ISTHMUS-EXIT N                                                    written by /init when the binary ended
Anything else on the console (kernel messages, /init's ISTHMUS-LOG lines) is kept in the log, never parsed.
"""
import json
import os
import struct
import sys
import xml.etree.ElementTree as ET

RESULT = "ISTHMUS-RESULT "
EXIT = "ISTHMUS-EXIT "


def patch_interp(src, dst, interp):
    data = bytearray(open(src, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"{src}: not an ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        p_type, = struct.unpack_from("<I", data, base)
        if p_type != 3:  # PT_INTERP
            continue
        p_offset, = struct.unpack_from("<Q", data, base + 8)
        p_filesz, = struct.unpack_from("<Q", data, base + 32)
        new = interp.encode() + b"\0"
        if len(new) > p_filesz:
            sys.exit(f"{src}: interpreter {interp!r} is longer than the {p_filesz - 1} bytes PT_INTERP holds")
        data[p_offset:p_offset + p_filesz] = new + b"\0" * (p_filesz - len(new))
        with open(dst, "wb") as f:
            f.write(data)
        return
    sys.exit(f"{src}: no PT_INTERP")


def parse_status(text):
    return dict(kv.split("=", 1) for kv in text.split())


def read_vm(name, console, status_text):
    status = parse_status(status_text)
    results, exit_code, lines = {}, None, 0
    with open(console, "rb") as f:
        for raw in f:
            lines += 1
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            # a kernel message can land in front of a line on the console: search, do not anchor
            at = line.find(RESULT)
            if at >= 0:
                try:
                    r = json.loads(line[at + len(RESULT):])
                    results[r["test"]] = r
                except (ValueError, KeyError) as e:
                    results.setdefault("<protocol>", {"test": "<protocol>", "verdict": "fail",
                                                      "summary": f"unparsable result line: {e}",
                                                      "output": line, "duration_ms": 0})
                continue
            at = line.find(EXIT)
            if at >= 0:
                try:
                    exit_code = int(line[at + len(EXIT):].split()[0])
                except (ValueError, IndexError):
                    pass
    return {"name": name, "status": status, "results": results, "exit": exit_code, "console": console}


def vm_problem(vm):
    rc = int(vm["status"].get("vm_rc", "0"))
    if rc in (124, 137):
        return f"VM timed out (timeout rc {rc})"
    if vm["exit"] is None:
        return f"VM ended without the test binary finishing (no ISTHMUS-EXIT line, VM rc {rc})"
    return None


def report(args):
    expected, out, vms = None, None, []
    i = 0
    while i < len(args):
        if args[i] == "--expected":
            expected = [l.strip() for l in open(args[i + 1]) if l.strip()]
            i += 2
        elif args[i] == "--out":
            out = args[i + 1]
            i += 2
        elif args[i] == "--vm":
            vms.append(read_vm(args[i + 1], args[i + 2], args[i + 3]))
            i += 4
        else:
            sys.exit(f"unknown argument {args[i]}")
    failed = False
    summary = {"kernels": []}
    suites = ET.Element("testsuites", name="isthmus-kernel-tests")
    for vm in vms:
        kernel = vm["status"].get("kernel", vm["name"])
        problem = vm_problem(vm)
        rows = []
        for name in expected:
            r = vm["results"].get(name)
            if r is None:
                r = {"test": name, "verdict": "fail", "duration_ms": 0,
                     "summary": "no result" + (f": {problem}" if problem else ""), "output": "", "measurements": {}}
            rows.append(r)
        for name, r in vm["results"].items():
            if name not in expected:
                rows.append(r)
        n_fail = sum(r["verdict"] == "fail" for r in rows)
        failed |= n_fail > 0 or problem is not None
        print(f"\n== {kernel} ({vm['status'].get('backend', '?')}): VM wall {vm['status'].get('wall_s', '?')} s, "
              f"host load {vm['status'].get('host_load', '?')}, "
              f"guest exit {vm['exit']}, {len(rows) - n_fail} of {len(rows)} ok"
              + (f" -- {problem}" if problem else ""))
        width = max([len(r["test"]) for r in rows] + [4])
        print(f"  {'test':<{width}}  verdict  time(s)  summary")
        for r in rows:
            print(f"  {r['test']:<{width}}  {r['verdict']:<7}  {r.get('duration_ms', 0) / 1000:7.1f}  {r.get('summary', '')}")
        for r in rows:
            if r["verdict"] == "fail" and r.get("output"):
                print(f"\n  --- {r['test']} output ---")
                for l in r["output"].splitlines():
                    print(f"  | {l}")
        print(f"  console: {vm['console']}")
        summary["kernels"].append({"kernel": kernel, "status": vm["status"], "guest_exit": vm["exit"],
                                   "problem": problem, "results": rows})
        suite = ET.SubElement(suites, "testsuite", name=kernel, tests=str(len(rows)), failures=str(n_fail),
                              skipped=str(sum(r["verdict"] == "skip" for r in rows)))
        for r in rows:
            case = ET.SubElement(suite, "testcase", classname=kernel, name=r["test"],
                                 time=f"{r.get('duration_ms', 0) / 1000:.3f}")
            if r["verdict"] == "fail":
                ET.SubElement(case, "failure", message=r.get("summary", "")).text = r.get("output", "")
            elif r["verdict"] == "skip":
                ET.SubElement(case, "skipped", message=r.get("summary", ""))
            ET.SubElement(case, "system-out").text = r.get("output", "")
        if problem:
            case = ET.SubElement(suite, "testcase", classname=kernel, name="<vm>")
            ET.SubElement(case, "error", message=problem)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    ET.ElementTree(suites).write(os.path.join(out, "junit.xml"), encoding="unicode", xml_declaration=True)
    print(f"\nreports: {out}/summary.json {out}/junit.xml")
    print("RESULT: " + ("FAIL" if failed else "PASS"))
    return 1 if failed else 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "patch-interp" and len(sys.argv) == 5:
        patch_interp(*sys.argv[2:5])
    elif len(sys.argv) >= 2 and sys.argv[1] == "report":
        sys.exit(report(sys.argv[2:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

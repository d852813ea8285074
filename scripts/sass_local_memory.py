#!/usr/bin/env python3
"""Local-memory loads and stores (LDL / STL: register spills, dynamically indexed arrays) of each kernel in an
sm_90 cubin, by source line, without cuobjdump or nvdisasm (this machine's CUDA toolkit ships neither).

ptxas -v says how many bytes a kernel spills, not where; a spill in a GEMM's main loop costs every k-block, one in
its set-up once. Build the cubin with -lineinfo (scripts/kernel_cubin.sh does), then:

    python3 scripts/sass_local_memory.py build/cubin/grouped_gemm_sm90.cubin --kernel 'ModeE3E'

How it reads the cubin: sm_90 instructions are 16 bytes with the opcode in the low 12 bits of the first 8, and
LDL is 0x983, STL 0x387 (checked against ptxas -v: in grouped_gemm_sm90.cu every instantiation with a 0-byte stack
frame has none, every one with spills has some; tests/sass_local_memory_test.sh checks a kernel of known lines).
Addresses map to lines through the DWARF line table that -lineinfo adds, read with binutils' readelf; the line is
the innermost inlined one, so a spill inside an inlined helper names the helper's line.
"""
import argparse
import bisect
import collections
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

LDL, STL = 0x983, 0x387


def fail(msg):
    print(f"sass_local_memory: {msg}", file=sys.stderr)
    sys.exit(2)


def read_sections(path):
    """{name: (offset, size)} of an ELF64 little-endian file, and the header's e_flags."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        fail(f"{path} is not a 64-bit little-endian ELF file (a cubin: nvcc -cubin -arch=sm_90a -lineinfo)")
    e_flags = struct.unpack_from("<I", data, 0x30)[0]
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        fail(f"{path}: section headers past the end of the file (truncated?)")
    raw = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]

    def name(o):
        end = data.index(b"\0", strtab + o)
        return data[strtab + o:end].decode()

    return data, e_flags, {name(r[0]): (r[4], r[5]) for r in raw}


def local_sites(data, sections):
    """{kernel symbol: (instruction count, [(address, 'LDL' | 'STL')])} from the .text.<symbol> sections."""
    out = {}
    for sec, (off, size) in sections.items():
        if not sec.startswith(".text."):
            continue
        sites = []
        for a in range(0, size - size % 16, 16):
            op = struct.unpack_from("<Q", data, off + a)[0] & 0xFFF
            if op == LDL or op == STL:
                sites.append((a, "LDL" if op == LDL else "STL"))
        out[sec[len(".text."):]] = (size // 16, sites)
    return out


def readelf(args):
    if not shutil.which("readelf"):
        fail("readelf not found (Debian package binutils)")
    r = subprocess.run(["readelf", "-W"] + args, capture_output=True, text=True)
    return r.stdout


def line_tables(path, sections):
    """{kernel symbol: sorted [(address, file, line)]}: the line table's sequences, each named by the relocation
    of its DW_LNE_set_address (the relocations of .debug_line, in offset order, one per sequence)."""
    syms, inside = [], False
    for l in readelf(["-r", path]).splitlines():
        if l.startswith("Relocation section"):
            inside = "'.rela.debug_line'" in l
            continue
        p = l.split()
        if inside and len(p) >= 5 and re.fullmatch(r"[0-9a-f]{16}", p[0]):
            sym = p[p.index("+") - 1] if "+" in p else p[-1]  # "... value name + addend"
            syms.append((int(p[0], 16), sym))
    syms.sort()
    seqs, cur, dirs = [], [], {}
    for l in readelf(["--debug-dump=decodedline", path]).splitlines():
        m = re.match(r"^(/.*):$", l)
        if m:
            dirs[os.path.basename(m.group(1))] = m.group(1)
            continue
        p = l.split()
        if len(p) >= 3 and p[1] == "-" and re.fullmatch(r"0x[0-9a-f]+", p[2]):
            cur.append((int(p[2], 16), None, None))  # end of sequence: its address is the code's end
            seqs.append(cur)
            cur = []
        elif len(p) >= 4 and p[1].isdigit() and re.fullmatch(r"0x[0-9a-f]+|0", p[2]):
            cur.append((int(p[2], 16), p[0], int(p[1])))
    if len(seqs) != len(syms):
        fail(f"{path}: {len(seqs)} line sequences but {len(syms)} .debug_line relocations (built with -lineinfo?)")
    tables = {}
    for (_, sym), seq in zip(syms, seqs):
        sym = sym[len(".text."):] if sym.startswith(".text.") else sym
        sec = sections.get(".text." + sym)
        end = max(a for a, _, _ in seq)
        if sec is None or end != sec[1]:
            fail(f"{path}: the line sequence of {sym[:80]} ends at {end:#x}, its code at "
                 f"{sec[1] if sec else 'nowhere':#x}: the sequences are not in relocation order here")
        tables[sym] = sorted(r for r in seq if r[1] is not None)
    return tables, dirs


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def source_line(dirs, file, line, cache={}):
    path = dirs.get(file)
    if path not in cache:
        try:
            cache[path] = open(path).read().splitlines() if path else []
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubin")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled or demangled name matches this regex")
    ap.add_argument("--all", action="store_true", help="also list the kernels with no local-memory access")
    args = ap.parse_args()
    data, e_flags, sections = read_sections(args.cubin)
    sm = (e_flags >> 8) & 0xFF
    if sm != 90:
        fail(f"{args.cubin} is built for sm_{sm} (e_flags {e_flags:#x}); the opcodes here are checked for sm_90 only")
    sites = local_sites(data, sections)
    tables, dirs = line_tables(args.cubin, sections) if any(s for _, s in sites.values()) else ({}, {})
    names = demangle(sorted(sites))
    pat = re.compile(args.kernel)
    shown = 0
    for sym in sorted(sites, key=lambda s: names[s]):
        if not (pat.search(sym) or pat.search(names[sym])):
            continue
        count, here = sites[sym]
        if not here and not args.all:
            continue
        shown += 1
        kinds = collections.Counter(k for _, k in here)
        print(f"{names[sym]}\n  {count} instructions, {kinds['LDL']} LDL, {kinds['STL']} STL")
        table = tables.get(sym, [])
        addrs = [a for a, _, _ in table]
        by_line = collections.Counter()
        for a, k in here:
            i = bisect.bisect_right(addrs, a) - 1
            by_line[(table[i][1], table[i][2]) if i >= 0 else ("?", 0), k] += 1
        for fl in sorted({fl for fl, _ in by_line}):
            n_ld, n_st = by_line[fl, "LDL"], by_line[fl, "STL"]
            print(f"  {fl[0]}:{fl[1]}  LDL {n_ld}  STL {n_st}  | {source_line(dirs, fl[0], fl[1])[:100]}")
    if shown == 0:
        print("no kernel with local-memory loads or stores" + (f" matching {args.kernel!r}" if args.kernel else ""))


if __name__ == "__main__":
    main()

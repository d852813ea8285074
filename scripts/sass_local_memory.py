#!/usr/bin/env python3
"""Local-memory loads and stores (LDL / STL: register spills, dynamically indexed arrays) of each kernel in an
sm_90 cubin, by source line, without cuobjdump or nvdisasm (this machine's CUDA toolkit ships neither).

ptxas -v says how many bytes a kernel spills, not where; a spill in a GEMM's main loop costs every k-block, one in
its set-up once. Build the cubin with -lineinfo (scripts/kernel_cubin.sh does), then:

    bash scripts/kernel_cubin.sh build build/cubins kernels/grouped_gemm_sm90.cu
    python3 scripts/sass_local_memory.py build/cubins/grouped_gemm_sm90.cubin --kernel 'ModeE3E'

How it reads the cubin: sm_90 instructions are 16 bytes with the opcode in the low 12 bits of the first 8, and
LDL is 0x983, STL 0x387 (checked against ptxas -v over the 259 functions of kernels/' 36 cubins: none exactly where
the stack frame is 0 bytes, both in each of the 29 that spill; tests/sass_local_memory_test.sh checks a kernel of
known lines).
Addresses map to lines through the DWARF line table that -lineinfo adds, read with binutils' readelf; the line is
the innermost inlined one, so a spill inside an inlined helper names the helper's line.

Loops: a backward BRA (opcode 0x947; its target is the next instruction + 4 x (bits 16-23 + 256 x the signed bits
34-81)) spans a loop from its target to itself, and each site is listed with the shortest such span that holds it:
its size and first line (the consumer's k-loop of a grouped GEMM is about a thousand instructions from its `for`).
It is the code's layout, not its control flow: a block that ptxas places out of line can sit inside a span it does
not run in, so read the span's first line before calling a site hot. That decoding lands all 5,539 branches of
grouped_gemm_sm90.cu's 20 kernels inside their kernel, on the k-loops, item loops and mbarrier spin loops where the
source has them, and all 17,002 branches of the 259 functions in kernels/' 36 cubins inside their function; a
branch that lands elsewhere stops the script (not sm_90 code, or a new form).
"""
import argparse
import bisect
import collections
import functools
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

LDL, STL, BRA = 0x983, 0x387, 0x947


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


def branch_target(a, lo, hi):
    """The target address of the BRA at address a (its two 64-bit words lo, hi)."""
    high = (lo >> 34) | ((hi & 0x3FFFF) << 30)  # 48 bits, signed
    if high >> 47:
        high -= 1 << 48
    return a + 16 + 4 * (((lo >> 16) & 0xFF) + 256 * high)


def local_sites(path, data, sections):
    """{kernel symbol: (instruction count, [(address, 'LDL' | 'STL')], [(loop start, loop end)])} from the
    .text.<symbol> sections; the loops are the spans of the backward branches, one per start (the longest)."""
    out = {}
    for sec, (off, size) in sections.items():
        if not sec.startswith(".text."):
            continue
        sites, loops = [], {}
        for a in range(0, size - size % 16, 16):
            lo, hi = struct.unpack_from("<QQ", data, off + a)
            op = lo & 0xFFF
            if op == LDL or op == STL:
                sites.append((a, "LDL" if op == LDL else "STL"))
            elif op == BRA:
                t = branch_target(a, lo, hi)
                if t < 0 or t >= size or t % 16:
                    fail(f"{path}: the branch at {a:#x} of {sec[6:][:80]} decodes to {t:#x}, outside its "
                         f"{size:#x} bytes: not the sm_90 encoding this script reads")
                if t <= a:
                    loops[t] = max(loops.get(t, a), a)
        out[sec[len(".text."):]] = (size // 16, sites, sorted(loops.items()))
    return out


def innermost_span(a, loops):
    """(length in bytes, start) of the shortest backward-branch span that holds address a, or None."""
    inside = [(end - start, start) for start, end in loops if start <= a <= end]
    return min(inside) if inside else None


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


@functools.lru_cache(maxsize=None)
def source_lines(path):
    try:
        return open(path).read().splitlines() if path else []
    except OSError:
        return []


def source_line(dirs, file, line):
    lines = source_lines(dirs.get(file))
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
    sites = local_sites(args.cubin, data, sections)
    tables, dirs = line_tables(args.cubin, sections) if any(s for _, s, _ in sites.values()) else ({}, {})
    names = demangle(sorted(sites))
    pat = re.compile(args.kernel)
    shown = 0
    for sym in sorted(sites, key=lambda s: names[s]):
        if not (pat.search(sym) or pat.search(names[sym])):
            continue
        count, here, loops = sites[sym]
        if not here and not args.all:
            continue
        shown += 1
        kinds = collections.Counter(k for _, k in here)
        print(f"{names[sym]}\n  {count} instructions, {kinds['LDL']} LDL, {kinds['STL']} STL")
        table = tables.get(sym, [])
        addrs = [a for a, _, _ in table]

        def where(a):  # (file, line) of address a
            i = bisect.bisect_right(addrs, a) - 1
            return table[i][1:] if i >= 0 else ("?", 0)

        by_line = collections.Counter()
        for a, k in here:
            inner = innermost_span(a, loops)
            ctx = "in a {}-instruction loop from {}:{}".format(inner[0] // 16 + 1, *where(inner[1])) if inner \
                else "in no loop"
            by_line[where(a), ctx, k] += 1
        for (file, line), ctx in sorted({(fl, ctx) for fl, ctx, _ in by_line}):
            n_ld, n_st = by_line[(file, line), ctx, "LDL"], by_line[(file, line), ctx, "STL"]
            print(f"  {file}:{line}  LDL {n_ld}  STL {n_st}  {ctx}  | {source_line(dirs, file, line)[:90]}")
    if shown == 0:
        print("no kernel with local-memory loads or stores" + (f" matching {args.kernel!r}" if args.kernel else ""))


if __name__ == "__main__":
    main()

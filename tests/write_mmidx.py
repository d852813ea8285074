#!/usr/bin/env python3
"""Write a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx, "MMIDIDX" format) with nothing but the
standard library, following the published layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter):

  .idx: b"MMIDIDX\\x00\\x00", <Q version = 1, <B dtype code, <Q sequence count N, <Q document count M,
        int32[N] sequence lengths, int64[N] sequence byte pointers into .bin, int64[M] document indices
        (0, then the sequence index ending each document), int8[N] sequence modes (multimodal only).
  .bin: the sequences' tokens back to back, little-endian, in the dtype.
  dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.

Independent of mxtrain's reader: tests read the files back with mxtrain and compare token for token.

Usage: write_mmidx.py PREFIX DTYPE [--documents E1,E2,...] [--multimodal] [--gap-bytes G] < sequences
  stdin: one sequence per line, tokens as whitespace-separated integers (an empty line: an empty sequence).
  --documents: sequence indices that end each document (default: every sequence is one document).
  --gap-bytes: G filler bytes before every sequence, so the pointers are not the running sum of lengths.
"""
import struct
import sys

CODES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"), "int64": (5, "q"),
         "float64": (6, "d"), "float32": (7, "f"), "uint16": (8, "H")}


def main(argv):
    if len(argv) < 3 or argv[2] not in CODES:
        sys.stderr.write(__doc__)
        return 2
    prefix, dtype = argv[1], argv[2]
    documents, multimodal, gap = None, False, 0
    rest = argv[3:]
    while rest:
        flag = rest.pop(0)
        if flag == "--documents":
            documents = [int(x) for x in rest.pop(0).split(",") if x]
        elif flag == "--multimodal":
            multimodal = True
        elif flag == "--gap-bytes":
            gap = int(rest.pop(0))
        else:
            sys.stderr.write("unknown option %s\n" % flag)
            return 2
    code, fmt = CODES[dtype]
    size = struct.calcsize("<" + fmt)
    text = sys.stdin.read()
    lines = text.split("\n")
    if text.endswith("\n") or not text:
        lines = lines[:-1]
    sequences = [[float(t) if fmt in "df" else int(t) for t in line.split()] for line in lines]
    lengths, pointers = [], []
    with open(prefix + ".bin", "wb") as b:
        at = 0
        for seq in sequences:
            b.write(b"\xAB" * gap)
            at += gap
            pointers.append(at)
            lengths.append(len(seq))
            b.write(struct.pack("<%d%s" % (len(seq), fmt), *seq))
            at += len(seq) * size
    doc_index = [0] + (documents if documents is not None else list(range(1, len(sequences) + 1)))
    with open(prefix + ".idx", "wb") as x:
        x.write(b"MMIDIDX\x00\x00")
        x.write(struct.pack("<Q", 1))
        x.write(struct.pack("<B", code))
        x.write(struct.pack("<Q", len(sequences)))
        x.write(struct.pack("<Q", len(doc_index)))
        x.write(struct.pack("<%di" % len(lengths), *lengths))
        x.write(struct.pack("<%dq" % len(pointers), *pointers))
        x.write(struct.pack("<%dq" % len(doc_index), *doc_index))
        if multimodal:
            x.write(struct.pack("<%db" % len(sequences), *([0] * len(sequences))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

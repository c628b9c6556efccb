"""Rebuild austen.jsonl.gz from Debian's r-cran-janeaustenr package (maintainer tool).

The six novels ship in that package as an R lazy-load database (data/Rdata.rdb/.rdx,
one character vector of lines per novel). This script reads it with a minimal R
unserializer (stdlib only, no R needed), splits each novel into chapters and writes one
JSON document per chapter, in a byte-reproducible gzip file.

    apt-get download r-cran-janeaustenr          # 1.0.0-1 was used
    dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python make_austen_jsonl.py pkg/usr/lib/R/site-library/janeaustenr/data austen.jsonl.gz

Not imported by grt_titan; kept beside the data it regenerates.
"""

import bz2
import gzip
import io
import json
import lzma
import re
import struct
import sys
import zlib

# Publication order; the name is the R object name in janeaustenr.
NOVELS = [
    ("sensesensibility", "Sense and Sensibility", 1811),
    ("prideprejudice", "Pride and Prejudice", 1813),
    ("mansfieldpark", "Mansfield Park", 1814),
    ("emma", "Emma", 1815),
    ("northangerabbey", "Northanger Abbey", 1817),
    ("persuasion", "Persuasion", 1817),
]
_CHAPTER = re.compile(r"^(CHAPTER|Chapter) ([IVXLC]+|\d+)\.?$")
_VOLUME = re.compile(r"^VOLUME [IVX]+$")


class _RReader:
    """Reads the subset of R's XDR serialization format that janeaustenr uses."""

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization stream")
        self.b, self.p, self.refs = data, 2, []
        version = self._int()
        self._int(), self._int()
        if version == 3:
            n = self._int()  # length of the native encoding name, then the name
            self.p += n

    def _int(self) -> int:
        (v,) = struct.unpack(">i", self.b[self.p : self.p + 4])
        self.p += 4
        return v

    def item(self):
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, flags & 512, flags & 1024
        if kind in (254, 253, 242, 241):  # NULL, global/empty/base env
            return None
        if kind == 255:  # reference to an earlier symbol
            return self.refs[(flags >> 8) - 1]
        if kind == 1:  # symbol
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if kind == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None
            s = self.b[self.p : self.p + n].decode("utf-8")
            self.p += n
            return s
        if kind == 2:  # pairlist
            attr = self.item() if has_attr else None
            del attr
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            return [(tag, car)] + (cdr or [])
        if kind in (16, 19):  # character vector, list
            value = [self.item() for _ in range(self._int())]
        elif kind in (10, 13):  # logical, integer
            value = [self._int() for _ in range(self._int())]
        else:
            raise ValueError(f"unsupported R type {kind}")
        return ("attr", value, self.item()) if has_attr else value


def _unwrap(v):
    return v[1] if isinstance(v, tuple) and v[0] == "attr" else v


def read_novels(data_dir: str) -> dict[str, list[str]]:
    with open(f"{data_dir}/Rdata.rdx", "rb") as f:
        index = _unwrap(_RReader(gzip.decompress(f.read())).item())
    variables = index[0]
    offsets, names = _unwrap(variables), variables[2][0][1]
    with open(f"{data_dir}/Rdata.rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for (off, length), name in zip(offsets, names):
        blob = rdb[off : off + length]
        (size,) = struct.unpack(">I", blob[:4])
        kind, body = blob[4:5], blob[5:]
        codecs = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress,
                  b"0": bytes}
        # R's compress=2/3 databases tag each entry; compress=TRUE ones are plain zlib.
        data = codecs[kind](body) if kind in codecs else zlib.decompress(blob[4:])
        assert len(data) == size, name
        out[name] = [line or "" for line in _unwrap(_RReader(data).item())]
    return out


def split_chapters(lines: list[str]) -> list[str]:
    starts = []
    for i, line in enumerate(lines):
        if _CHAPTER.match(line.strip()):
            j = i - 1  # a "VOLUME II" heading just above belongs to this chapter
            while j >= 0 and not lines[j].strip():
                j -= 1
            starts.append(j if j >= 0 and _VOLUME.match(lines[j].strip()) else i)
    starts[0] = 0  # title page and preface go with chapter 1
    bounds = starts + [len(lines)]
    return ["\n".join(lines[a:b]).strip() + "\n" for a, b in zip(bounds, bounds[1:])]


def main(data_dir: str, out_path: str) -> None:
    novels = read_novels(data_dir)
    buf = io.BytesIO()
    for name, title, year in NOVELS:
        for k, text in enumerate(split_chapters(novels[name]), start=1):
            doc = {"text": text, "title": title, "author": "Jane Austen", "year": year,
                   "chapter": k}
            buf.write(json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n")
    with open(out_path, "wb") as f:  # mtime=0, no file name: byte-reproducible
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            gz.write(buf.getvalue())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

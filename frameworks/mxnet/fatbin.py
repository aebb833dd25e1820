"""Which GPU architectures a CUDA shared library carries code for, read from the library itself.

nvcc puts each translation unit's device code into a *fatbin* in the ELF section ``.nv_fatbin``
(one fatbin per object, concatenated). A fatbin is a 16-byte header followed by entries::

    header: u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 size of the entries
    entry:  u16 kind (1 = PTX, 2 = ELF cubin), u16 version, u32 header_size, u64 payload_size,
            ... u32 arch at offset 28 (e.g. 90 for sm_90) ...; the payload follows the entry header

This layout was checked against libraries built by nvcc 13.0 (the fixtures in tests/data:
``-gencode arch=compute_90,code=sm_90`` and a multi-architecture one with PTX). Nothing here
imports a framework or needs a GPU.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from pathlib import Path

from kernelmap.errors import ParseError

FATBIN_MAGIC = 0xBA55ED50
_ELF_MAGIC = b"\x7fELF"
_FATBIN_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEAD = struct.Struct("<HHIQ")  # kind, version, header_size, payload_size
_ENTRY_ARCH_OFFSET = 28


class CodeKind(enum.IntEnum):
    """The kind field of a fatbin entry."""

    PTX = 1
    CUBIN = 2


@dataclass(frozen=True)
class FatbinSummary:
    """The architectures of one library: ``sm`` = machine code (cubins), ``ptx`` = PTX versions."""

    path: str
    sm: tuple[int, ...] = ()
    ptx: tuple[int, ...] = ()
    fatbins: int = 0
    entries: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # "sm_90" / "compute_90" -> entries

    def runs_on(self, sm: int) -> bool:
        """Whether code for a GPU of compute capability ``sm`` (e.g. 90) is here.

        A cubin for sm_XY runs on sm_XZ with Z >= Y (same major); PTX of compute_XY is JIT-compiled
        for any sm >= XY. Arch-specific cubins (sm_90a) carry the same number and count as sm_90.
        """
        if any(s // 10 == sm // 10 and s <= sm for s in self.sm):
            return True
        return any(p <= sm for p in self.ptx)

    def describe(self) -> str:
        parts = [f"sm_{s}" for s in self.sm] + [f"compute_{p} (PTX)" for p in self.ptx]
        return ", ".join(parts) if parts else "no GPU code"


def _elf_sections(fh, path: str) -> dict[str, list[tuple[int, int]]]:
    """name -> [(file offset, size)] of an ELF64 little-endian file's sections."""
    ident = fh.read(16)
    if len(ident) < 16 or ident[:4] != _ELF_MAGIC:
        raise ParseError(path, "not an ELF file (no \\x7fELF magic)")
    if ident[4] != 2 or ident[5] != 1:
        raise ParseError(path, f"unsupported ELF class/data {ident[4]}/{ident[5]} (need 64-bit little-endian)")
    head = fh.read(48)
    if len(head) < 48:
        raise ParseError(path, "truncated ELF header")
    (_type, _machine, _version, _entry, _phoff, shoff, _flags, _ehsize, _phentsize, _phnum,
     shentsize, shnum, shstrndx) = struct.unpack("<HHIQQQIHHHHHH", head)
    if shoff == 0 or shnum == 0:
        raise ParseError(path, "ELF file has no section headers")
    if shentsize < 64:
        raise ParseError(path, f"ELF section header size {shentsize} < 64")
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    if len(table) < shentsize * shnum:
        raise ParseError(path, "truncated ELF section header table")
    headers = []
    for i in range(shnum):
        name, _stype, _sflags, _addr, offset, size = struct.unpack_from("<IIQQQQ", table, i * shentsize)
        headers.append((name, _stype, offset, size))
    if shstrndx >= shnum:
        raise ParseError(path, f"ELF section-name table index {shstrndx} out of range")
    _, _, str_off, str_size = headers[shstrndx]
    fh.seek(str_off)
    strtab = fh.read(str_size)
    out: dict[str, list[tuple[int, int]]] = {}
    for name_off, stype, offset, size in headers:
        end = strtab.find(b"\0", name_off)
        name = strtab[name_off:end if end >= 0 else None].decode("ascii", "replace")
        if stype == 8:  # SHT_NOBITS: no bytes in the file
            continue
        out.setdefault(name, []).append((offset, size))
    return out


def parse_fatbins(data: bytes, path: str, base: int = 0) -> tuple[list[tuple[CodeKind, int]], int]:
    """((kind, arch) of every entry, number of fatbins) of the fatbins concatenated in ``data``
    (a section's bytes; ``base`` is its file offset, for messages). Zero padding between fatbins is
    skipped; any other byte where a fatbin should start is an error."""
    magic = struct.pack("<I", FATBIN_MAGIC)
    entries: list[tuple[CodeKind, int]] = []
    count = 0
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos:pos + 4] != magic:
            nxt = data.find(magic, pos)
            gap = data[pos:nxt if nxt >= 0 else n]
            if any(gap):
                raise ParseError(path, f"bytes at offset {base + pos:#x} are neither padding nor a fatbin "
                                       f"(magic {FATBIN_MAGIC:#x})")
            if nxt < 0:
                break
            pos = nxt
        if pos + _FATBIN_HEADER.size > n:
            raise ParseError(path, f"truncated fatbin header at offset {base + pos:#x}")
        _magic, _version, header_size, fat_size = _FATBIN_HEADER.unpack_from(data, pos)
        start, end = pos + header_size, pos + header_size + fat_size
        if header_size < _FATBIN_HEADER.size or end > n:
            raise ParseError(path, f"fatbin at offset {base + pos:#x} claims {fat_size} bytes past the section end")
        count += 1
        p = start
        while p < end:
            if p + _ENTRY_ARCH_OFFSET + 4 > end:
                raise ParseError(path, f"truncated fatbin entry at offset {base + p:#x}")
            kind, _ev, entry_header, payload = _ENTRY_HEAD.unpack_from(data, p)
            (arch,) = struct.unpack_from("<I", data, p + _ENTRY_ARCH_OFFSET)
            try:
                code_kind = CodeKind(kind)
            except ValueError:
                raise ParseError(path, f"fatbin entry at offset {base + p:#x} has unknown kind {kind}") from None
            if entry_header < _ENTRY_ARCH_OFFSET + 4 or p + entry_header + payload > end:
                raise ParseError(path, f"fatbin entry at offset {base + p:#x} has sizes past its fatbin")
            entries.append((code_kind, arch))
            p += entry_header + payload
        pos = end
    return entries, count


def read_archs(path: str | Path) -> FatbinSummary:
    """The architectures in ``path``'s ``.nv_fatbin`` section(s); ``ParseError`` if it is no ELF file
    or a fatbin is malformed. A library without device code gives an empty summary."""
    path = str(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise ParseError(path, exc.strerror or str(exc)) from None
    entries: list[tuple[CodeKind, int]] = []
    fatbins = 0
    with fh:
        sections = _elf_sections(fh, path)
        for offset, size in sections.get(".nv_fatbin", []):
            fh.seek(offset)
            data = fh.read(size)
            if len(data) < size:
                raise ParseError(path, f".nv_fatbin section at {offset:#x} is truncated")
            found, count = parse_fatbins(data, path, offset)
            fatbins += count
            entries += found
    counts: dict[str, int] = {}
    for kind, arch in entries:
        key = f"sm_{arch}" if kind is CodeKind.CUBIN else f"compute_{arch}"
        counts[key] = counts.get(key, 0) + 1
    return FatbinSummary(
        path=path,
        sm=tuple(sorted({a for k, a in entries if k is CodeKind.CUBIN})),
        ptx=tuple(sorted({a for k, a in entries if k is CodeKind.PTX})),
        fatbins=fatbins,
        entries=len(entries),
        counts=counts,
    )


def needed_libraries(path: str | Path) -> list[str]:
    """The DT_NEEDED sonames of an ELF shared library (its ``.dynamic`` section), in order."""
    return _dynamic_strings(path, 1)


def soname(path: str | Path) -> str | None:
    """The DT_SONAME of an ELF shared library, or None."""
    names = _dynamic_strings(path, 14)
    return names[0] if names else None


def _dynamic_strings(path: str | Path, wanted_tag: int) -> list[str]:
    path = str(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise ParseError(path, exc.strerror or str(exc)) from None
    with fh:
        sections = _elf_sections(fh, path)
        if ".dynamic" not in sections or ".dynstr" not in sections:
            raise ParseError(path, "no .dynamic/.dynstr section (not a shared library?)")
        (dyn_off, dyn_size), (str_off, str_size) = sections[".dynamic"][0], sections[".dynstr"][0]
        fh.seek(dyn_off)
        dyn = fh.read(dyn_size)
        fh.seek(str_off)
        strtab = fh.read(str_size)
    out = []
    for i in range(0, len(dyn) - 15, 16):
        tag, val = struct.unpack_from("<qQ", dyn, i)
        if tag == 0:  # DT_NULL
            break
        if tag == wanted_tag:  # DT_NEEDED 1, DT_SONAME 14
            end = strtab.find(b"\0", val)
            out.append(strtab[val:end].decode())
    return out

"""The probe on the wire: the TCP SYN segment and its checksum, reading a reply from a raw
socket and what its flags say, the classic BPF filter that keeps a raw socket to our port, and
the local socket helpers (the reserved source port, the route's source address, whether raw
sockets are permitted).

Everything here uses the standard library only: RemoteProber sends the source of these functions
to the probe host in its script (``remote.remote_script``), so the local and the remote probe
share them. Keep them self-contained: a function here may use only the standard library modules
the script imports and the constants ``SYN_ACK``, ``RST`` and ``SO_ATTACH_FILTER``.
"""

from __future__ import annotations

import ctypes
import socket
import struct

SYN_ACK, RST = 0x12, 0x04  # TCP flags
SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; the socket module does not name it


def tcp_checksum(src: bytes, dst: bytes, segment: bytes) -> int:
    """The TCP checksum of ``segment`` from ``src`` to ``dst`` (4- or 16-byte addresses)."""
    if len(src) == 4:
        pseudo = src + dst + struct.pack("!BBH", 0, 6, len(segment))
    else:
        pseudo = src + dst + struct.pack("!IxxxB", len(segment), 6)
    data = pseudo + segment
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def syn_segment(src: bytes, dst: bytes, sport: int, dport: int, seq: int) -> bytes:
    """A TCP SYN with an MSS option (as real clients send) from ``src:sport`` to ``dst:dport``."""
    options = struct.pack("!BBH", 2, 4, 1460)
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 6 << 4, 0x02, 64240, 0, 0)
    segment = header + options
    checksum = tcp_checksum(src, dst, segment)
    return segment[:16] + struct.pack("!H", checksum) + segment[18:]


def ack_segment(src: bytes, dst: bytes, sport: int, dport: int, seq: int, ack: int) -> bytes:
    """A bare TCP ACK from ``src:sport`` to ``dst:dport`` that belongs to no connection: a live
    kernel answers it with a RST whose sequence number is ``ack``, whether a listener's accept
    queue is full (when it drops SYNs) or not."""
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, 0x10, 64240, 0, 0)
    checksum = tcp_checksum(src, dst, header)
    return header[:16] + struct.pack("!H", checksum) + header[18:]


def reply_seq(packet: bytes, ip_header: bool) -> int | None:
    """The sequence number of a TCP packet read from a raw socket (None when it is not one)."""
    if ip_header:
        if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != 6:
            return None
        packet = packet[(packet[0] & 0x0F) * 4 :]
    if len(packet) < 20:
        return None
    return int(struct.unpack("!I", packet[4:8])[0])


def parse_reply(packet: bytes, ip_header: bool) -> tuple[bytes, int, int, int, int] | None:
    """``(source address, source port, destination port, ack, flags)`` of a TCP packet read
    from a raw socket (IPv4 packets carry their IP header, IPv6 ones do not: the source
    address of an IPv6 packet is then empty and the caller takes it from recvfrom)."""
    src = b""
    if ip_header:
        if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != 6:
            return None
        src = packet[12:16]
        packet = packet[(packet[0] & 0x0F) * 4 :]
    if len(packet) < 20:
        return None
    sport, dport, _seq, ack, _off, flags = struct.unpack("!HHIIBB", packet[:14])
    return src, sport, dport, ack, flags


def source_address(family: int, address: str, port: int) -> str:
    """The local address the kernel would use to reach ``address`` (a routing lookup)."""
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.connect((address, port))
        return str(udp.getsockname()[0])


def reserve_port(family: int) -> socket.socket:
    """A TCP socket bound to a fresh port and never connected: while it is open no local
    connection can use the port, and the kernel answers every SYN-ACK sent to it with a RST."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    return sock


def classify(flags: int) -> str | None:
    """``answered`` for a SYN-ACK, ``refused`` for a RST, None for anything else."""
    if flags & RST:
        return "refused"
    if flags & SYN_ACK == SYN_ACK:
        return "answered"
    return None


def raw_sockets_permitted() -> bool:
    """Whether this process may open a raw TCP socket (root or CAP_NET_RAW)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()
    except OSError:
        return False
    return True


def port_filter(port: int, ip_header: bool) -> bytes:
    """A classic BPF program keeping only TCP packets to ``port``: a raw TCP socket otherwise
    receives a copy of every TCP packet the host receives."""
    ld_port = [(0xB1, 0, 0, 0), (0x48, 0, 0, 2)] if ip_header else [(0x28, 0, 0, 2)]
    program = [*ld_port, (0x15, 0, 1, port), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def attach_filter(sock: socket.socket, program: bytes) -> None:
    """Attach the classic BPF ``program`` (from ``port_filter``) to ``sock`` (Linux)."""
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)

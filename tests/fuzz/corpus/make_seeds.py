#!/usr/bin/env python3
"""Writes the hand-built seeds of tests/fuzz/corpus/{api_args,cache_row}.

The byte layouts follow the order in which fuzz_api_args.cc and
fuzz_cache_row.cc consume their input (tests/fuzz/fuzz_input.h): a change
to a harness's decoding needs this script to be run again.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def u16(v):
    return struct.pack('<H', v)


def pick(v):  # pick_int / pick_enum in range: value = lo + v
    return bytes([0]) + u16(v)


def ptr(buf, off256):  # a real buffer at a 256-byte multiple
    return bytes([0x80 | buf, off256])


def stride8(v):
    return bytes([0, v // 8])


def tensor(buf, off, s0, s1, s2):
    return ptr(buf, off) + stride8(s0) + stride8(s1) + stride8(s2) + bytes([0])


def config(head_dim=16, hq_mult=2, causal=1):
    return (bytes([0]) + pick(0) + pick(head_dim // 8) + bytes([0]) + bytes([1]) +
            pick(0) + pick(hq_mult - 1) + pick(causal) + pick(0) + pick(0) +
            bytes([4, 0]) + bytes([1]) + bytes([0, 0, 0]))


# forward: batch 1, seqlen_q 8, seqlen_k 8, heads 2/1, head_dim 16
FWD = (bytes([0, 0]) + pick(0) + pick(7) + pick(7) + tensor(0, 0, 256, 32, 16) +
       tensor(1, 0, 128, 16, 16) + tensor(1, 0, 128, 16, 16) + tensor(3, 0, 256, 32, 16) +
       ptr(3, 4) + bytes([0]) + bytes([0]))
# decode: one query, 8 cache slots, cache_seqlens[0] = 3, 2 splits
DEC = (bytes([1, 0]) + pick(0) + pick(0) + pick(7) + tensor(0, 0, 32, 32, 16) +
       tensor(1, 0, 128, 16, 16) + tensor(1, 0, 128, 16, 16) + ptr(2, 1) + pick(2) +
       ptr(3, 4) + tensor(3, 0, 32, 32, 16) + bytes([0]) + bytes([0]) + bytes([1]) +
       bytes([0]))
# reduce: the decode workspace's 2 partial states into o
RED = (bytes([2, 0]) + pick(1) + pick(0) + pick(0) + ptr(3, 4) + stride8(32) + stride8(32) +
       stride8(32) + stride8(16) + bytes([0]) + ptr(3, 5) + bytes([201, 1, 201, 1, 201, 0, 201, 0]) +
       tensor(3, 0, 32, 32, 16) + bytes([0]) + bytes([0]))
GEN = bytes([3]) + pick(0) + bytes([1]) + u16(0) + bytes([1, 100, 0])

VALID = config() + FWD + DEC + RED + GEN


def api_seeds():
    yield 'valid_all', VALID
    yield 'valid_forward_bf16', config(head_dim=8, hq_mult=1, causal=0)[:1] + pick(1) + config(
        head_dim=8, hq_mult=1, causal=0)[4:] + FWD
    yield 'bad_struct_size', bytes([230]) + VALID[1:]
    yield 'null_desc', config()[:-3] + bytes([255, 0, 0]) + FWD + GEN
    yield 'null_args', config() + FWD[:-1] + bytes([255]) + DEC[:-1] + bytes([255])
    # q misaligned, then a wild 64-bit pointer for k
    bad = bytearray(VALID)
    q_at = len(config()) + 2 + 9
    bad[q_at:q_at + 2] = bytes([0x21, 3])
    yield 'misaligned_q', bytes(bad)
    yield 'wild_shapes', config() + bytes([0, 0, 250, 0xff, 0xff, 0xff, 0x7f]) + FWD[5:]
    yield 'huge_strides', config() + FWD[:5 + 6] + bytes([202]) + FWD[5 + 7:] + DEC
    yield 'generate_small_buf', config() + bytes([3]) + pick(2) + bytes([1]) + u16(2) + bytes(
        [0]) + u16(100) + bytes([100, 0])
    yield 'empty', b''


def cache_seeds():
    def blob(b):
        return u16(len(b)) + b

    mat = b'forward f16 d32 sm80 v7'
    spec = b'forward f16 sm80 d32 dv32'
    ptx = b'.version 7.0\n.target sm_80\n.address_size 64\n'
    cubin = b'\x7fELF\x02\x01\x01'
    fields = blob(mat) + blob(spec) + blob(ptx) + blob(cubin)
    def i64(v):
        return struct.pack('<q', v)

    # Storage class picks: a byte < 200 keeps the column's normal class;
    # integer columns (4-9: sm, versions, times, hits) then read an int64.
    ints = [80, 7, 0, 1700000000000, 1700000000000, 0]
    classes_ok = bytes(3) + b''.join(bytes([0]) + i64(v) for v in ints) + bytes(4)
    yield 'valid_row', fields + bytes([1, 1]) + bytes([0]) + classes_ok + bytes([0])
    yield 'valid_no_material', fields + bytes([1, 1]) + bytes([0]) + classes_ok + bytes([1])
    yield 'other_material', fields + bytes([1, 1]) + bytes([0]) + classes_ok + bytes([2]) + blob(b'x')
    yield 'bad_ptx_hash', fields + bytes([0]) + blob(b'0123456789abcdef') + bytes([1, 0]) + classes_ok + bytes([0])
    yield 'short_cubin_hash', fields + bytes([1, 0]) + blob(b'short') + bytes([0]) + classes_ok + bytes([1])
    # spec as a REAL, sm as TEXT, ptx and cubin as TEXT (hashes still right)
    odd = (bytes([0, 0, 203]) + struct.pack('<i', 7) + bytes([201]) + b''.join(
        bytes([0]) + i64(v) for v in ints[1:]) + bytes([0, 0, 201, 201]))
    yield 'odd_classes', fields + bytes([1, 1, 0]) + odd + bytes([1])
    # sm as NULL: the NOT NULL insert fails and get() misses
    yield 'null_sm', fields + bytes([1, 1, 0]) + bytes([0, 0, 0, 204]) + classes_ok[12:] + bytes([0])
    yield 'other_key', fields + bytes([1, 1, 250]) + blob(b'0123456789abcdef') + classes_ok + bytes([0])
    yield 'empty_blobs', blob(b'') * 4 + bytes([1, 1, 0]) + classes_ok + bytes([0])
    yield 'empty', b''


for name, gen in (('api_args', api_seeds), ('cache_row', cache_seeds)):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    for fname, data in gen():
        with open(os.path.join(d, fname), 'wb') as f:
            f.write(data)

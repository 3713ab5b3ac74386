"""The address-tagged fill: byte i of a storage is a hash of (salt, i), identical on every device and machine.

One implementation, used to fill storages (materialize), to recompute what a byte should be (the failure
signature's "which storage did this byte come from"), and inlined into standalone reproducers.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def salt(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def fill_pattern(raw: torch.Tensor, salt: int) -> None:
    """Fill `raw` (uint8, any device) in place with a hash of (salt, position).

    Each 8-byte word at word position w gets splitmix64(w ^ salt) in wrapping int64 arithmetic, so the bytes
    are identical on every device and machine, and every byte depends on where it is. CPU memory (pageable
    or pinned) is filled with numpy, whose per-call cost is a fraction of torch's; small device storages are
    filled on the host and copied over in one transfer; large ones are hashed on the device.
    """
    n = raw.numel()
    if raw.device.type == "cpu":
        if n >= LARGE_HOST_FILL_BYTES and torch.cuda.is_available() and raw.is_pinned():
            _fill_host_on_device(raw, salt)  # scale tier: GiBs of pinned host memory, hashed on the GPU
            return
        _fill_numpy(raw.numpy(), salt)
        return
    if n <= SMALL_DEVICE_FILL_BYTES:
        # Staged in pinned memory from torch's caching host allocator, which keeps the block until the queued
        # copy has run: the host does not wait for the GPU here (runner.py waits once, after the "before" copy).
        staging = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        _fill_numpy(staging.numpy(), salt)
        raw.copy_(staging, non_blocking=True)
        return
    words_total = (n + 7) // 8
    chunk = 1 << 22  # words per step: bounds the int64 temporaries to 32 MiB
    for first_word in range(0, words_total, chunk):
        words = min(chunk, words_total - first_word)
        start = first_word * 8
        count = min(words * 8, n - start)
        raw[start : start + count] = _hashed_words(first_word, words, salt, raw.device).view(torch.uint8)[:count]


def _hashed_words(first_word: int, words: int, salt: int, device: torch.device) -> torch.Tensor:
    """splitmix64(w ^ salt) for words w in [first_word, first_word + words), int64 on `device`."""
    x = torch.arange(first_word, first_word + words, dtype=torch.int64, device=device) ^ salt
    x = x * SPLITMIX_MULTIPLIER_1
    x = x ^ (x >> 31)
    x = x * SPLITMIX_MULTIPLIER_2
    return x ^ (x >> 29)


# Pinned host storages from this size on are hashed on the GPU and copied down: numpy fills about 1 GB/s, so
# a 4 MiB host source re-filled for every index variant cost ~4 ms of a case that otherwise takes ~2 ms.
LARGE_HOST_FILL_BYTES = 1 << 20
HOST_FILL_STEP_WORDS = 1 << 24  # 128 MiB per step


def _fill_host_on_device(raw: torch.Tensor, salt: int) -> None:
    """The same bytes as the numpy fill, computed on the current GPU in 128 MiB steps and copied into the
    pinned (or registered) host storage: a GiB costs tens of milliseconds instead of seconds of numpy."""
    device = torch.device("cuda", torch.cuda.current_device())
    n = raw.numel()
    words_total = (n + 7) // 8
    for first_word in range(0, words_total, HOST_FILL_STEP_WORDS):
        words = min(HOST_FILL_STEP_WORDS, words_total - first_word)
        start = first_word * 8
        count = min(words * 8, n - start)
        raw[start : start + count].copy_(_hashed_words(first_word, words, salt, device).view(torch.uint8)[:count])
    torch.cuda.synchronize(device)


SPLITMIX_MULTIPLIER_1 = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
SPLITMIX_MULTIPLIER_2 = -4658895280553007687  # 0xBF58476D1CE4E5B9
SMALL_DEVICE_FILL_BYTES = 1 << 20


def _fill_numpy(out: np.ndarray, salt: int) -> None:
    """fill_pattern's arithmetic on a uint8 numpy array: numpy int64 arrays wrap on overflow and shift right
    arithmetically, exactly like torch's int64, so both forms give the same bytes. Whole words are hashed in
    place in `out` (viewed as int64, little-endian like torch's view), in cache-sized steps."""
    if out.size <= FILL_STEP_WORDS * 8:  # one step: hash into a scratch block and copy (fewest numpy calls)
        x = np.arange((out.size + 7) // 8, dtype=np.int64)
        x ^= np.int64(salt)
        x *= SPLITMIX_MULTIPLIER_1
        x ^= x >> 31
        x *= SPLITMIX_MULTIPLIER_2
        x ^= x >> 29
        out[:] = x.view(np.uint8)[: out.size]
        return
    whole_words = out.size // 8
    words = out[: whole_words * 8].view(np.int64)
    scratch = np.empty(min(whole_words, FILL_STEP_WORDS), dtype=np.int64)
    for first in range(0, whole_words, FILL_STEP_WORDS):
        last = min(first + FILL_STEP_WORDS, whole_words)
        _splitmix_in_place(words[first:last], first, salt, scratch[: last - first])
    tail = out.size - whole_words * 8
    if tail:
        last_word = np.empty(1, dtype=np.int64)
        _splitmix_in_place(last_word, whole_words, salt, np.empty(1, dtype=np.int64))
        out[whole_words * 8 :] = last_word.view(np.uint8)[:tail]


FILL_STEP_WORDS = 1 << 16  # 512 KiB per step: the word block and its scratch stay in cache


def _splitmix_in_place(x: np.ndarray, first_word: int, salt: int, scratch: np.ndarray) -> None:
    x[:] = np.arange(first_word, first_word + x.size, dtype=np.int64)
    x ^= np.int64(salt)
    x *= SPLITMIX_MULTIPLIER_1
    np.right_shift(x, 31, out=scratch)
    x ^= scratch
    x *= SPLITMIX_MULTIPLIER_2
    np.right_shift(x, 29, out=scratch)
    x ^= scratch

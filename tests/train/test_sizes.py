"""The one size parser and printer of both packages (toolbox_train.sizes, issue 45: `human_size` was
defined three times, `parse_size` twice): what each former copy said, it still says."""

from __future__ import annotations

import pytest

from toolbox_train.commands import rccl_check
from toolbox_train.contract import UserError
from toolbox_train.sizes import human_size, parse_size


def test_parse_size_reads_vendor_and_binary_units():
    assert parse_size("128GiB") == parse_size("128G") == parse_size("128 gib") == 128 << 30
    assert parse_size("137GB") == 137 * 10**9 and parse_size("1.5TiB") == int(1.5 * 2**40)
    assert parse_size("4096") == parse_size("4096B") == 4096
    assert parse_size("64GB", decimal=False) == 64 << 30  # as rccl-tests read sizes
    for bad in ("lots", "iB", "4Q", ""):
        with pytest.raises(ValueError, match="expected a size"):
            parse_size(bad)


def test_human_size():
    assert [human_size(n) for n in (0, 1023, 1024, 1536, 5 << 20, 3 << 30, 2 << 40, 5000 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB", "3.0 GiB", "2.0 TiB", "5000.0 TiB"]


def test_rccl_check_reads_and_prints_sizes_as_before():
    # K/M/G binary, KB too; its own one-line error (exit 2) and a positive size; the table's sizes
    # without a trailing .0
    assert [rccl_check.parse_size(s) for s in ("4K", "256KB", "1M", "64KiB", "2G", "512")] == [
        4 << 10, 256 << 10, 1 << 20, 64 << 10, 2 << 30, 512]
    for bad, said in (("12Q", "size '12Q': expected a number"), ("0", "size '0' must be positive")):
        with pytest.raises(UserError, match=said):
            rccl_check.parse_size(bad)
    assert [rccl_check.human(n) for n in (512, 4096, 1536, 256 << 20, 3 << 30)] == [
        "512 B", "4 KiB", "1.5 KiB", "256 MiB", "3 GiB"]

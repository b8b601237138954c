"""`initialize_from` checks that need no training: every differing architecture field is named at once, and
a path source is keyed by the checkpoint it resolves to (its folder and a fingerprint of its metadata)."""

from __future__ import annotations

import pytest

from schooner.train._init import check_compatible


def test_every_differing_field_is_named_with_both_values(nano) -> None:
    with pytest.raises(ValueError) as info:
        check_compatible(nano(num_layers=3, intermediate_dim=256), nano(), where="'src'")
    message = str(info.value)
    assert "2 model config fields differ" in message
    assert "'num_layers' differs: the source has num_layers=2, this run num_layers=3" in message
    assert (
        "'intermediate_dim' differs: the source has intermediate_dim=128, this run intermediate_dim=256"
        in message
    )
    # runtime fields may differ and are not listed
    check_compatible(nano(max_seq_len=64, compute_dtype="bfloat16"), nano(), where="'src'")

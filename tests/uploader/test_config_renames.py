"""Retry settings have one set of names (attempts, backoff_seconds, backoff_max_seconds): a key
set under its old name fails with an error that names the new one, never silently."""

from __future__ import annotations

from lmforge.uploader.cli import main


def test_the_old_attempts_key_is_a_config_error_naming_the_new_one(tmp_path, capsys):
    args = ["restore", "--src", f"file://{tmp_path / 'store'}", "--dir", str(tmp_path / "ckpt")]
    assert main([*args, "--set", "transfer.max_attempts=2"]) == 2
    assert "transfer: Value error, 'max_attempts' is now 'attempts'" in capsys.readouterr().err
    assert main([*args, "--set", "transfer.attempts=2", "--set", "transfer.backoff_seconds=0.1"]) == 0

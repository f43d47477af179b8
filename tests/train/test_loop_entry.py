"""Entry point: a bad train.toml exits 2 with one line naming the key (before any heavy import)."""

import os

from train.main import main


def test_unknown_key_exits_2_naming_it(tmp_path, capsys):
    config = tmp_path / "train.toml"
    config.write_text("[train]\nlearning_rat = 1e-4\n")
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "train.learning_rat" in err and "learning_rate" in err


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


def test_allocator_setting_defaults_but_never_overrides(tmp_path, monkeypatch):
    from train.main import CUDA_ALLOC_CONF

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    main(["--config", str(tmp_path / "nope.toml")])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == CUDA_ALLOC_CONF
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    main(["--config", str(tmp_path / "nope.toml")])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256")  # torch's newer name wins too
    main(["--config", str(tmp_path / "nope.toml")])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ

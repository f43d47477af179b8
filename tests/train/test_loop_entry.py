"""Entry point: a bad train.toml exits 2 with one line naming the key (before any heavy import)."""

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

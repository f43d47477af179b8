"""Profile env names and setup lines: credentials are refused, ordinary names that merely contain
TOKEN/KEY (TOKENIZERS_PARALLELISM, NCCL_IB_HCA, ...) are accepted."""

from __future__ import annotations

import pytest

from launcher.resolve.profile import ClusterProfile, is_secret_name
from contract.schema import ConfigError, build

SECRETS = ["HF_TOKEN", "WANDB_API_KEY", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
           "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "DB_PASSWORD", "MY_PASSWD_FILE", "CLIENT_SECRET", "TOKEN",
           "PRIVATE_KEY", "hf_token", "GITHUB_APIKEY"]
ORDINARY = ["TOKENIZERS_PARALLELISM", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "KEYS_DIR", "CUDA_KEYBOARD_LAYOUT",
            "TOKEN_BUDGET", "NCCL_DEBUG", "FI_PROVIDER", "MONKEY_PATCH", "PYTHONHASHSEED"]


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names_are_recognised(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_profile_env_accepts_tokenizer_and_nccl_names_and_refuses_credentials() -> None:
    profile = build(ClusterProfile, {"env": {"TOKENIZERS_PARALLELISM": "false", "NCCL_IB_HCA": "mlx5"}})
    assert profile.env["TOKENIZERS_PARALLELISM"] == "false"
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        with pytest.raises(ConfigError, match=f"env.{name}: looks like a secret"):
            build(ClusterProfile, {"env": {name: "x"}})


def test_setup_lines_refuse_secret_assignments_only() -> None:
    build(ClusterProfile, {"setup": ["export TOKENIZERS_PARALLELISM=false", "module load cuda/12.4"]})
    with pytest.raises(ConfigError, match="sets HF_TOKEN, which looks like a secret"):
        build(ClusterProfile, {"setup": ["export HF_TOKEN=hf_abc"]})
    with pytest.raises(ConfigError, match="sets WANDB_API_KEY"):
        build(ClusterProfile, {"setup": ["WANDB_API_KEY=abc python -c pass"]})

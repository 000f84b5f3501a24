"""`hf-scratch`, the installed command (pyproject.toml's entry point): a module outside the package, so that it
starts before anything heavy. Importing `hf_scratch_transformer` imports torch and transformers, seconds in all,
and a Ctrl-C meanwhile ended in a KeyboardInterrupt traceback: it is answered as `hf_scratch_transformer.cli.main`
answers one later, with one line and exit status 130 (`stopped_by_ctrl_c`, which both use)."""

import os
import sys


def is_rank_zero() -> bool:
    """Not one of the other processes of a launched run (a stray RANK alone does not make a command one)."""
    return int(os.environ.get("RANK", 0)) == 0 or int(os.environ.get("WORLD_SIZE", 1)) == 1


def stopped_by_ctrl_c() -> None:
    if is_rank_zero():
        print("\nstopped by Ctrl-C", file=sys.stderr)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    try:
        from hf_scratch_transformer.cli import main as run_command
    except KeyboardInterrupt:
        stopped_by_ctrl_c()
    run_command(argv)

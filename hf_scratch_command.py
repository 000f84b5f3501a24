"""`hf-scratch`, the installed command (pyproject.toml's entry point): a module outside the package, so that it
starts before anything heavy. Importing `hf_scratch_transformer` imports torch and transformers (11 s on a 2-core
AVX2 host): `--help`, `--version` and an unknown command are answered without it, and a Ctrl-C while a command's
imports run stops with one line and exit status 130 (not a KeyboardInterrupt traceback), as the training commands'
own handler (`run_options.stop_cleanly_on_ctrl_c`) stops them later. An environment the package refuses (a dependency
out of its range or of transformers') is answered with the reason and the fix alone, without the import's traceback.

Each subcommand is a flat script module of `hf_scratch_transformer.cli` (or `tokenizer_training`), run as
`__main__` with the remaining arguments, so that

    hf-scratch train --max-steps 100        ==  python -m hf_scratch_transformer.cli.train --max-steps 100
    accelerate launch -m hf_scratch_transformer.cli.train_accelerate ...     (several processes)

and `scripts/*.py` in a checkout are thin wrappers over the same modules.
"""

import gc
import importlib
import os
import runpy
import sys
from importlib.metadata import version

# subcommand -> (module run as __main__, one line of help)
COMMANDS = {
    "train": ("hf_scratch_transformer.cli.train", "train a model with Trainer (the main job)"),
    "train-accelerate": ("hf_scratch_transformer.cli.train_accelerate", "train with an Accelerate loop (DDP, FSDP)"),
    "finetune": ("hf_scratch_transformer.cli.finetune", "fine-tune a saved model for text or token classification"),
    "tokenizer": ("tokenizer_training", "train a tokenizer for a model family"),
    "convert": ("hf_scratch_transformer.cli.convert", "convert a saved folder to or from a native family"),
    "publish": ("hf_scratch_transformer.cli.publish", "publish a saved model folder to the Hub (or --dry-run)"),
    "serve": ("hf_scratch_transformer.cli.serve", "serve a saved folder with `transformers serve` (OpenAI API)"),
    "benchmark": ("hf_scratch_transformer.cli.benchmark", "measure speed and memory side by side with native models"),
}


def is_rank_zero() -> bool:
    """Not one of the other processes of a launched run (a stray RANK alone does not make a command one)."""
    return int(os.environ.get("RANK", 0)) == 0 or int(os.environ.get("WORLD_SIZE", 1)) == 1


def stopped_by_ctrl_c() -> None:
    if is_rank_zero():
        print("\nstopped by Ctrl-C", file=sys.stderr)
    sys.exit(130)


def command_help(docstring: str) -> str:
    """A subcommand's `--help` text above its options: its module docstring's summary and the examples that follow
    it (a summary alone ended on the colon that announced them)."""
    return "\n\n".join(docstring.split("\n\n")[:2])


def package_refusal(error: BaseException | None) -> ImportError | None:
    """The package's refusal of the environment (`installed_dependencies`: an ImportError named after the package),
    where `error` is it or was caused by it (runpy wraps an error raised while it imports the command's package)."""
    while error is not None:
        if isinstance(error, ImportError) and error.name == "hf_scratch_transformer":
            return error
        error = error.__cause__
    return None


def import_without_collecting(module: str) -> None:
    """Import the package of the command `module` (for `hf_scratch_transformer.cli`'s: torch, transformers and ours,
    about 400,000 objects that live as long as the process) with the garbage collector paused, then freeze what the
    process holds out of the collector's generations (`gc.freeze`). Collecting while importing walked those objects
    again and again, and every full collection of a command's data work walked them once more (docs/training.md,
    "Startup"). Cyclic garbage made before the freeze is never collected: a few MB of the imports'. A program that runs
    a command in its own process (`main([...])`) and goes on can give its objects back with `gc.unfreeze()`."""
    collecting = gc.isenabled()  # a program that runs a command in its own process may have turned it off
    gc.disable()
    try:
        importlib.import_module(module.rpartition(".")[0] or module)
    finally:
        if collecting:
            gc.enable()
    gc.freeze()


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    return "usage: hf-scratch [--version] COMMAND [ARGS...]   (hf-scratch COMMAND --help for its options)\n\n" \
        "commands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    if argv[0] == "--version":
        print(f"hf-scratch {version('hf-scratch-transformer')}")
        return
    name, arguments = argv[0], argv[1:]
    if name not in COMMANDS:  # exit status 2, as argparse gives every other bad command line
        print(f"hf-scratch: error: unknown command {name!r}\n\n{usage()}", end="", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"hf-scratch {name}", *arguments]  # argparse's prog, as the user typed it
    try:
        import_without_collecting(COMMANDS[name][0])
        runpy.run_module(COMMANDS[name][0], run_name="__main__")
    except ImportError as error:
        refusal = package_refusal(error)
        if refusal is None:  # a fault of ours: its traceback is what finds it
            raise
        print(f"{sys.argv[0]}: error: {refusal}", file=sys.stderr)  # the reason and the fix, as argparse would
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C while the command's imports run (the package's included: seconds), or in a
        # command without a handler of its own (`run_options.stop_cleanly_on_ctrl_c`). One line and 130, as there.
        stopped_by_ctrl_c()


if __name__ == "__main__":  # `python -m hf_scratch_command ...`: it ran nothing and exited 0, without a word
    main()

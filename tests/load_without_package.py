"""Load saved folders the way a Hub user does, in a process where `hf_scratch_transformer` cannot be imported, and
write what the models compute. The tests call `run_without_package`, which runs this file as a script:

    python load_without_package.py JOBS.pt RESULTS.pt
    python load_without_package.py --run SCRIPT.py [SCRIPT.py ...]

JOBS.pt holds a list of {"folder", "auto_class", "inputs"} and optionally {"pipeline_task", "text"}; RESULTS.pt
gets, per job, the model's first output (logits or last hidden state) and the pipeline's result. With --run, the
scripts run instead (a model card's example, say), one after the other: a fresh interpreter takes 10-15 s to import
torch and transformers on a 2-core machine. `output_of` gives the part of the output that one script wrote.
"""

import importlib.abc
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

HEADER = "\n==> "  # before each script's output under --run, on stdout and stderr


def run_without_package(folder: Path, *arguments) -> subprocess.CompletedProcess:
    """This file run as a script with `arguments`, in a fresh interpreter working in `folder` (its `trust_remote_code`
    modules cached there), offline, without PYTHONPATH and without a terminal to answer a question; output
    captured."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(folder / "modules"))
    return subprocess.run([sys.executable, __file__, *map(str, arguments)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, cwd=folder, env=env, timeout=600, check=False)


def output_of(completed: subprocess.CompletedProcess, script: Path) -> str:
    """What `script` of a `--run` wrote to stdout and stderr (its traceback too, where it raised). A run that
    crashed, or ended before `script`, fails the caller's test here."""
    if completed.returncode not in (0, 1) or _header(script) not in completed.stdout:
        raise AssertionError(f"{script} did not run to its end (exit status {completed.returncode}): "
                             f"{completed.stderr[-3000:]}")
    return "".join(_section(stream, script) for stream in (completed.stdout, completed.stderr))


def _section(output: str, script) -> str:
    """The part of `output` under `script`'s header, up to the next header."""
    return output.split(_header(script))[1].split(HEADER)[0]



def _header(script) -> str:
    return f"{HEADER}{script}\n"


def _ran(script: str) -> bool:
    """`script` run as `__main__` after its header on stdout and stderr; False, its traceback printed, where it
    raised."""
    for stream in (sys.stdout, sys.stderr):
        print(end=_header(script), file=stream, flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except (Exception, SystemExit):  # an example has no reason to exit
        traceback.print_exc()
        return False
    finally:
        sys.stdout.flush()
    return True


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Makes the package unimportable, as on a machine where it was never installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_scratch_transformer":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def main(arguments: list[str]) -> None:
    sys.meta_path.insert(0, _NotInstalled())
    import torch
    import transformers

    try:
        import hf_scratch_transformer  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("hf_scratch_transformer is importable: this check would prove nothing")
    if arguments[0] == "--run":
        failed = [script for script in arguments[1:] if not _ran(script)]
        raise SystemExit(f"failed: {', '.join(failed)}" if failed else 0)

    jobs_path, results_path = arguments[:2]
    results = []
    for job in torch.load(jobs_path):
        model = getattr(transformers, job["auto_class"]).from_pretrained(job["folder"], trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        with torch.no_grad():
            result = {"class": type(model).__name__, "output": model(**job["inputs"])[0]}
        if "pipeline_task" in job:
            pipe = transformers.pipeline(job["pipeline_task"], model=job["folder"], trust_remote_code=True)
            result["pipeline"] = pipe(job["text"], **job.get("pipeline_kwargs", {}))
        results.append(result)
    torch.save(results, results_path)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Publish a saved model folder to the Hugging Face Hub, or list what would be uploaded:

    hf-scratch publish outputs/quickstart/model --repo-id USER/scratch-gpt-shakespeare --dry-run
    hf auth login                                     # or export HF_TOKEN=...
    hf-scratch publish outputs/quickstart/model --repo-id USER/scratch-gpt-shakespeare --private

The folder needs config.json, the weights and the model code (`save_pretrained` writes them), the tokenizer, and a
README.md model card (`hf_scratch_transformer.hub.write_model_card`). Checkpoints (checkpoints/, checkpoint-N/),
folders being written or removed (NAME.tmp, NAME.deleted) and hidden files are not uploaded, at any depth; the
uploaded card's "How to use" loads --repo-id (the folder's card is left as it is). Weight files the repository holds
from an earlier upload in the other layout (one file or shards), and tokenizer files the folder does not hold (an
earlier tokenizer's special_tokens_map.json, say, which would override the new one), are deleted in the same commit.
"""

import argparse
from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError

from hf_scratch_command import command_help
from hf_scratch_transformer.hub import card_repo_id, publish

# The HTTP library's own errors (no connection, a name that does not resolve, a timeout), whichever library
# huggingface_hub uses (httpx, httpx2): the base class of its HTTP error besides OSError. They ended in a traceback.
HTTP_LIBRARY_ERRORS = tuple(base for base in HfHubHTTPError.__mro__[1:] if base.__name__ == "HTTPError")


def namespaced_repo_id(text: str) -> str:
    """--repo-id as USER/NAME or ORG/NAME: a bare NAME is created under the token's user, and the dry run could not
    say which repo the card's "How to use" would load."""
    if text.count("/") != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give USER/NAME or ORG/NAME")
    return text


# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=command_help(__doc__),
                                 formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("folder", type=Path, help="a save_pretrained folder with its model card")
parser.add_argument("--repo-id", type=namespaced_repo_id, required=True,
                    help="the Hub model repository, USER/NAME (created if missing)")
parser.add_argument("--private", action="store_true",
                    help="create the repository as private (an existing public one is refused: nothing is uploaded)")
parser.add_argument("--dry-run", action="store_true", help="check the folder and list its files; upload nothing")
parser.add_argument("--commit-message", default="Upload hf-scratch-transformer model",
                    help="default: Upload hf-scratch-transformer model")
args = parser.parse_args()

# ----------------------------------------------------------------------------------------------- publish
try:
    result = publish(
        args.folder, args.repo_id, private=args.private, dry_run=args.dry_run, commit_message=args.commit_message
    )
except ValueError as error:  # an incomplete folder: refused as a bad argument (status 2), without a traceback
    parser.exit(2, f"{parser.prog}: error: {error}\n")
except (OSError, *HTTP_LIBRARY_ERRORS) as error:  # huggingface_hub's (no token, no access, offline), the network's
    parser.exit(1, f"{parser.prog}: error: could not publish {args.folder} to {args.repo_id}: "
                   f"{type(error).__name__}: {error}\n")
if args.dry_run:
    for path, size in result:
        print(f"{size:>12,}  {path}")
    print(f"{sum(size for _, size in result):>12,}  bytes in {len(result)} files would go to {args.repo_id} (dry run)")
    if (named := card_repo_id(args.folder)) not in (None, args.repo_id):  # publish sets it in the uploaded card
        print(f"README.md: its \"How to use\" loads {named!r}; uploaded, it loads {args.repo_id!r}")
else:
    print(f"published {args.folder} to {args.repo_id}: {result}")

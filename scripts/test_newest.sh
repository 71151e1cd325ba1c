#!/usr/bin/env bash
# Each extra's tests against what `pip install 'torchx[<extra>]'` resolves today: no
# constraints.txt, the newest versions pyproject allows (its caps included).
#
#   bash scripts/test_newest.sh [extra ...]      # default: prefect mlflow kfp
#
# One venv per extra under .venvs/, named by a digest of what uv resolved for it: a later run
# on this machine that resolves the same versions reuses it (it only resolves again); a new
# release of any dependency makes a new venv, and the extra's older ones are removed.
# torch: the machine's one copy of the CPU wheel (scripts/torch_wheel.sh: pip fetches it
# from the machine's local wheels); uv resolves the rest with torch excluded, then installs
# that wheel file with it, so no resolver ever picks a CUDA build. (uv links the unpacked
# wheel from its cache into each venv; pip unpacked it anew, 80 s a venv on a loaded
# machine.) Nothing is byte-compiled ahead (43 s and 74 s of CPU a venv, for modules the
# tests mostly never import): the tests run without PYTHONDONTWRITEBYTECODE, so each module
# they import is compiled once, into the venv.
# The extras' tests run in parallel, one pytest per venv; a failing extra fails the script.
# Measured 2026-12-02 on a 2-core machine (a slow one that day), no .venvs, uv's cache
# warm: 2:55 alone (the three venvs made in 26 s; 182 s before, with pip's unpack and the
# ahead-of-time byte-compile), 2:51-3:11 after the test command in .ci/run. Resolved then:
# prefect 3.9.1, kfp 2.17.3, mlflow 3.17.2. On 2026-12-07 it resolved mlflow 3.18.0, and the
# tests that assumed torchx's sqlite fast path failed with it: each now states what holds
# on a revision the tests checked and what holds through MLflow's own client on any other.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=("$@")
[ ${#EXTRAS[@]} -gt 0 ] || EXTRAS=(prefect mlflow kfp)
TEST_DEPS=(pytest pytest-timeout pytest-xdist pytest-asyncio)

# what each extra's tests install besides it: they record lineage in MLflow, and some run
# the example stages (scikit-learn, numpy)
with_of() {
    case "$1" in
        mlflow) echo examples ;;
        *) echo mlflow,examples ;;
    esac
}
# the tests of each extra (all of them also run, pinned, in the whole suite): what touches
# the extra's own API, without the longest trainings (the reference pipelines' 2-process DDP
# stages, minutes on a loaded 2-core machine) and all but one way of ending a served flow run
tests_of() {
    local p=tests/pipelines/prefect/test_prefect.py k=tests/pipelines/kfp/test_kfp.py
    case "$1" in
        prefect) echo "$p" \
            "--deselect=$p::test_timeout_of_the_flow_cancels_the_app" \
            "--deselect=$p::test_ending_a_served_flow_run_ends_its_app[wait-cancel-CANCELLED]" \
            "--deselect=$p::test_ending_a_served_flow_run_ends_its_app[block-cancel-CANCELLED]" \
            "--deselect=$p::test_ending_a_served_flow_run_ends_its_app[hook-kill-CRASHED]" ;;
        mlflow) echo tests/trackers/test_mlflow.py tests/trackers/test_mlflow_store.py \
            "--deselect=tests/trackers/test_mlflow.py::test_pipeline_lineage_with_a_2x2_ddp_job" ;;
        kfp) echo "$k" tests/pipelines/kfp/test_kfp_build.py \
            "--deselect=$k::test_reference_pipeline_runs_with_kfp_local_and_records_lineage" ;;
        *) return 1 ;;
    esac
}
for extra in "${EXTRAS[@]}"; do
    tests_of "$extra" >/dev/null || { echo "test_newest: no tests listed for extra '$extra' (known: prefect, mlflow, kfp)" >&2; exit 2; }
done

start=$SECONDS
bash scripts/setup.sh >/dev/null   # its .venv has uv
UV="$PWD/.venv/bin/uv"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo torch > "$work/excludes.txt"
TORCH_WHEEL=$(bash scripts/torch_wheel.sh)
printf '%s\n' "${TEST_DEPS[@]}" > "$work/test-deps.txt"
mkdir -p .venvs

# prepare EXTRA: resolve, then create the venv unless one of this resolution exists
prepare() {
    local extra=$1 lock key venv
    lock="$work/$extra.txt"
    echo "-e .[$extra,$(with_of "$extra")]" > "$work/$extra.in"
    "$UV" pip compile --quiet --python "$PWD/.venv/bin/python" --no-header --no-annotate \
        --excludes "$work/excludes.txt" "$work/$extra.in" "$work/test-deps.txt" -o "$lock"
    key=$( (cat "$lock"; basename "$TORCH_WHEEL"; "$PY" -c 'import sys; print(sys.version)') \
        | sha256sum | cut -c1-12)
    venv=".venvs/newest-$extra-$key"
    if [ ! -e "$venv/.complete" ]; then
        rm -rf "$venv"
        "$PY" -m venv "$venv"
        "$UV" pip install --quiet --python "$venv/bin/python" -r "$lock" "$TORCH_WHEEL"
        touch "$venv/.complete"
    fi
    for old in .venvs/newest-"$extra"-*; do
        [ "$old" = "$venv" ] || rm -rf "$old"
    done
    echo "$venv" > "$work/$extra.venv"
}

pids=()
for extra in "${EXTRAS[@]}"; do
    prepare "$extra" > "$work/$extra.log" 2>&1 &
    pids+=($!)
done
failed=()
for i in "${!EXTRAS[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "test_newest: could not install torchx[${EXTRAS[$i]}]:" >&2
        tail -n 20 "$work/${EXTRAS[$i]}.log" >&2
        failed+=("${EXTRAS[$i]}")
    fi
done
[ ${#failed[@]} -eq 0 ] || exit 1
echo "test_newest: venvs ready after $((SECONDS - start)) s"

pids=()
for extra in "${EXTRAS[@]}"; do
    venv=$(cat "$work/$extra.venv")
    # shellcheck disable=SC2046
    (
        set -f   # the test ids' [..] are no globs
        echo "== torchx[$extra]: $("$venv/bin/python" -c "from importlib.metadata import version as v; print(', '.join(f'{p} {v(p)}' for p in dict.fromkeys(('$extra', 'mlflow', 'torch'))))")"
        PATH="$PWD/$venv/bin:$PATH" env -u PYTHONDONTWRITEBYTECODE \
            "$venv/bin/python" -m pytest -q -p no:cacheprovider \
            -n 0 $(tests_of "$extra")
    ) > "$work/$extra.out" 2>&1 &
    pids+=($!)
done
for i in "${!EXTRAS[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    extra=${EXTRAS[$i]}
    if [ "$rc" -eq 0 ]; then
        head -n 1 "$work/$extra.out"
        tail -n 1 "$work/$extra.out"
    else
        cat "$work/$extra.out"
        failed+=("$extra")
    fi
done
echo "test_newest: $((SECONDS - start)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
    echo "test_newest: failed with the newest versions: ${failed[*]}" >&2
    exit 1
fi

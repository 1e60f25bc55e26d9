#!/usr/bin/env bash
# One GPU-host session: install the carried wheels, run the gate evidence, and bring results back in $OUT.
# Usage (on the GPU host, from the repo root):
#   bash bench/gpu_session.sh COMMIT STAGE...                     stages in order, on GPU 0
#   bash bench/gpu_session.sh COMMIT --lanes "STAGE..." "STAGE..."  lane i on GPU i, lanes side by side
# A stage may end in @SECONDS, its own time limit (e.g. walk:fmha/flash_mma@540 sweep:gemm@200). DEADLINE_S=SECONDS
# (the device time the call has, less its start) caps every limit so that the archives below are still written.
# Stages: smoke, suite, example, adversarial, cost, corpus_mb (bench/corpus_memory_bound.sh: the memory-bound corpus gated,
# recorded), fidelity (bench/timing_fidelity.py: $FIDELITY_REPEATS (20) gates of a
# short-kernel expert, each a fresh runner, then the noisy vendor; make it the first stage after the machine starts),
# stepcode (bench/step_code.py: which steps of the GPU walks ran their parent's machine code, on every core),
# gatecost:WORKLOAD[,WORKLOAD] (bench/gate_cost.py: cold against warm runner per candidate, policies $GATECOST_POLICIES
# (state,timed)), sandboxcost (bench/sandbox_cost.py --gpu: gates with and without
# the sandbox, and one sanitized gate inside it), mmapeak (bench/mma_peak.py), profile:KERNEL (bench/profile_gemm.py under ncu), gputests, gputest:NAME[:K] (tests/test_gpu_NAME.py; those -k K, else $GPUTEST_K, selects), multigpu,
# walk:KERNEL (a recorded GPU walk of at most $WALK_MAX_STEPS (80) steps and $WALK_MAX_REJECTIONS (8) refusals, prefetched from the kernel's committed dry walk),
# rebuild ($OUT/library.json: `library build` over the walks $REBUILD_LINEAGES names (globs) and those this call wrote,
# the trials of the library $REBUILD_TRIALS kept; an admit stage after it admits from it),
# walkcase:KERNEL (that walk, then $PERCASE_PER_CARD (1) steps of each card induced from it alone timed on every case, furthest from 1 first,
# within $PERCASE_TIMEOUT (240) s),
# prefetch:KERNEL (that prefetch alone, recorded, each lane its share of the states), bias:NAME:STEP,STEP[:PLACEMENT] (bench/timing_bias.py
# probe: a walk's steps timed with controls, as_loaded or exchanged; NAME as in bench/walks, e.g. conv2d_implicit_gemm_any:13,35), placement:NAME:STEP
# (bench/timing_bias.py placement: copies of the step's parent loaded and allocated in different orders), retime:NAME
# (bench/retime.py: a walk's biased and outweighed steps, or retime:NAME:STEP,STEP those, timed with places exchanged,
# each lane its share), percase:NAME
# (bench/percase.py: the walk's steps behind the bundled library's cards, at most $PERCASE_PER_CARD a card when set, or
# percase:NAME:STEP,STEP all of those, timed on every case and SWEEP case, places $PERCASE_PLACEMENT (as_loaded);
# the cards of $PERCASE_LIBRARY when set, else of the bundled library;
# without steps each lane its share, or in lane N the share $PERCASE_SHARE_N; bench/percase.py --lanes prints lanes), sweep:NAME
# (bench/sweeps/NAME.toml), transfer:OP,OP or transfer:pending (those no committed part in bench/results/transfer-parts
# measured on this card with these settings) (bench/transfer_eval.py on the GPU, each operator its own part
# results/transfer/OP.json and its own time limit, budget $TRANSFER_BUDGET (24), $TRANSFER_JOBS (6), the library strategy
# $TRANSFER_STRATEGY (default: transfer_eval.py's, the optimize default; or library), the searches' rivals
# $TRANSFER_RIVALS (default: transfer_eval.py's), the library strategy's ordering $TRANSFER_ORDERING (default: transfer_eval.py's), the library
# $TRANSFER_LIBRARY (default: the bundled one; $OUT/library.json is the one an admit stage before it wrote); join with --merge), admit (a library built from corpus/lineages, or $ADMIT_FROM to resume, or the one a rebuild stage before it wrote; the cards
# $ADMIT_CARDS names when set (untried: those no trial has judged whose per-case effects say where they pay), and in lane N those $ADMIT_CARDS_N names; admission trials on the GPU, timed with places $ADMIT_PLACEMENT (as_loaded), the walks $ADMIT_LINEAGES (a glob) and those this call wrote read besides corpus/lineages, $ADMIT_JOBS
# trial kernels' correctness side by side, the earlier trials of the libraries $ADMIT_MEASUREMENTS names read where they
# measured the same kernel on the same target, case, policy and GPU (default: $REBUILD_TRIALS): $OUT/library.json, written after every card; lanes write
# $OUT/library-N.json, joined into $OUT/library.json when all lanes are done), skills:SPEC (bench/skills_eval.py
# --only SPEC on the GPU gate, recorded, budget $SKILLS_BUDGET, each strategy run cut after $SKILLS_RUN_S seconds if set
# (in lane N, $SKILLS_RUN_S_N first),
# each workload's operator held out of the library when $SKILLS_HOLD_OUT is set (transfer: a separate experiment),
# $SKILLS_JOBS (in lane N, $SKILLS_JOBS_N first) candidates' correctness side by side: results/skills-SPEC.json with ':' as '-', rewritten
# after every strategy, and the optimization documents in results/skills-docs; SPEC is OPERATOR, EXPERT or
# either :STRATEGY, comma-separated; join the lanes' parts with skills_eval.py --merge), or PROBLEM:KERNEL (a
# gate run, recorded). What stages write under $OUT/results and $OUT/lineages comes back in $OUT/results.tgz.
# multigpu needs PostgreSQL and Redis there: the pgserver wheel (keep .whl-web's wheels in .whl for that call) and
# redis-server in .hostbin (carried).
set -u
commit=${1:-unknown}; shift || true
[ -n "${DEADLINE_S:-}" ] && export DEADLINE=$(( $(date +%s) + DEADLINE_S ))  # see stage()
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KLINEAGE_GIT_COMMIT=$commit
# A wheel missing from .whl fails every stage alike: stop at once and name it (bench/README.md lists the wheels).
python3 -c 'import klineage.gate.pipeline, klineage.cli' || { echo "the engine does not import here: carry the missing wheel in .whl"; exit 1; }
# Verdicts are recorded into the checkout (so a walk finds earlier recordings); the new ones go back in $OUT.
export KLINEAGE_CACHE_DIR=/tmp/kcache KLINEAGE_RECORDED_DIR=$PWD/recorded NCCL_NVLS_ENABLE=0
mkdir -p recorded/verdicts && touch /tmp/session-start
export PATH=$PATH:/usr/local/cuda/bin
# Untrusted code runs under bubblewrap (docs/sandbox.md): the host has none, so the carried one (with its libraries).
if [ -f .hostbin/bwrap ]; then chmod +x .hostbin/bwrap; export KLINEAGE_BWRAP=$PWD/.hostbin/bwrap; fi
python3 -c 'from klineage.gate.jail import launcher, shown_launcher; b = launcher(); print("sandbox:", b and shown_launcher(b))' || echo "sandbox: UNAVAILABLE (see above)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
echo "sanitizer: $(command -v compute-sanitizer)"
mkdir -p "$OUT/lineages" "$OUT/results"

# The walk is written plain: it comes back inside results.tgz, compressed already, and goes into corpus/lineages/
# as it is or into bench/walks/ gzip-compressed (bench/walks/README.md says how).
walk() {  # walk:problem/kernel -> $OUT/lineages/problem_kernel.gpu.json; more arguments go to `klineage walk`
  local kernel=$1 name=${1//\//_} guess; shift
  guess=bench/walks/$name.dry.json.gz  # a dry walk with today's catalog (bench/walks/README.md), else the corpus's
  for guess in "$guess" corpus/lineages/$name.{full.dry,dry}.json{,.gz}; do [ -f "$guess" ] && break; done
  timeout "${limit:-${WALK_TIMEOUT:-540}}" python3 -m klineage walk "$kernel" --gate gpu --record --prefetch "$guess" \
    --jobs "${WALK_JOBS:-6}" --max-steps "${WALK_MAX_STEPS:-80}" --max-rejections "${WALK_MAX_REJECTIONS:-8}" --out "$OUT/lineages/$name.gpu.json" "$@"
}

walkcase() {  # walkcase:problem/kernel: its walk (limit: the stage's), then steps of each of its cards timed per case
  local name=${1//\//_}
  walk "$1" || return
  python3 -m klineage library build "$OUT/lineages/$name.gpu.json" --out "/tmp/$name.cards.json" \
    --per-case ignore --note "the cards of one walk: which of its steps to time on every case" > /dev/null || return
  timeout "${PERCASE_TIMEOUT:-240}" python3 bench/percase.py "$OUT/lineages/$name.gpu.json" \
    --per-card "${PERCASE_PER_CARD:-1}" --by-effect --placement "${PERCASE_PLACEMENT:-as_loaded}" --library "/tmp/$name.cards.json"
}

deadline_left() { echo $(( DEADLINE - $(date +%s) - ${DEADLINE_MARGIN:-30} )); }

stage() {  # STAGE or STAGE@SECONDS: a time limit for this stage alone (walks, sweeps, tests, gates)
  local limit="" spec
  # only a number after the last @ is a limit: a lineage id holds an @ of its own
  if [[ $1 =~ ^(.*)@([0-9]+)$ ]]; then limit=${BASH_REMATCH[2]}; set -- "${BASH_REMATCH[1]}"; fi
  # DEADLINE (epoch seconds; DEADLINE_S sets it from the session's start): no limit runs past it less
  # $DEADLINE_MARGIN (30) s for the archives after the stages, which a call cut by the device's own limit never writes
  if [ -n "${DEADLINE:-}" ]; then
    local left; left=$(deadline_left)
    if (( left < 10 )); then echo "=== $1 skipped: ${left} s left before the deadline"; return; fi
    if [ -z "$limit" ] || (( limit > left )); then limit=$left; fi
  fi
  echo "=== $1 ($(date -u +%T))${limit:+, limit ${limit} s}"
  case $1 in
    smoke) timeout 240 python3 -m klineage gate row_softmax row_softmax/naive --sanitize never ;;
    suite) timeout 420 python3 bench/gate_suite.py --out "$OUT/results" ;;
    multigpu) chmod -R a+rX /tmp/site
      PATH=/tmp/site/pgserver/pginstall/bin:$PWD/.hostbin:$PATH timeout 540 python3 bench/multigpu.py ${MULTIGPU_ARGS:-} --out "$OUT/results/multigpu.json" ;;
    # -v: one line per test as it ends, so a run cut by the timeout still shows what passed
    gputests) timeout "${limit:-${TESTS_TIMEOUT:-420}}" python3 -m pytest tests/test_gpu_*.py -v --no-header -n 0 -p no:django -p no:cacheprovider -rA ;;
    gputest:*) local name=${1#gputest:} select=${GPUTEST_K:-}  # gputest:NAME:K selects with -k K (no spaces)
      [[ $name == *:* ]] && select=${name#*:} && name=${name%%:*}
      timeout "${limit:-${TESTS_TIMEOUT:-420}}" python3 -m pytest "tests/test_gpu_${name}.py" -v --no-header -n 0 -p no:django \
      -p no:cacheprovider -rA ${select:+-k "$select"} ;;
    profile:*) local name=${1#profile:}  # Nsight Compute on one launch of a GEMM expert beside cuBLAS
      timeout "${limit:-240}" ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section LaunchStats --section MemoryWorkloadAnalysis python3 bench/profile_gemm.py --kernel "$name" \
        > "$OUT/results/profile-${name//\//_}.txt" 2>&1; grep -v "^==PROF==" "$OUT/results/profile-${name//\//_}.txt" | head -400 ;;
    sandboxcost) timeout "${limit:-540}" python3 bench/sandbox_cost.py --gpu --repeats "${SANDBOX_REPEATS:-3}" \
      --out "$OUT/results/sandbox_cost_gpu.json" ;;
    corpus_mb) CORPUS_MB_SHARE=${LANE:+$LANE/$LANES} timeout "${limit:-600}" bash bench/corpus_memory_bound.sh "$OUT/results" ;;
    # resumes from the committed record: a call cut short leaves the rest open for the next
    # the census's output goes to a file: a compile the deadline cut may outlive it and must hold no pipe open;
    # the record is also left in the checkout, where a rebuild stage after it reads it (library build's default)
    stepcode) cp corpus/step_code.json "$OUT/results/" 2>/dev/null
      timeout "${limit:-540}" python3 bench/step_code.py --out "$OUT/results/step_code.json" --jobs "$(nproc)" \
        --deadline-s $(( ${limit:-540} - 20 )) > /tmp/stepcode.txt 2>&1 < /dev/null
      cat /tmp/stepcode.txt; cp "$OUT/results/step_code.json" corpus/step_code.json ;;
    mmapeak) timeout "${limit:-120}" python3 bench/mma_peak.py --out "$OUT/results/mma-peak.json" ;;
    fidelity) timeout "${limit:-560}" python3 bench/timing_fidelity.py --repeats "${FIDELITY_REPEATS:-20}" \
      --out "$OUT/results/timing_fidelity.json" ;;
    gatecost:*) timeout "${limit:-560}" python3 bench/gate_cost.py --workloads "${1#gatecost:}" \
      --policies "${GATECOST_POLICIES:-state,timed}" --out "$OUT/results/gate_cost_warm-${1#gatecost:}.json" ;;
    example|adversarial|cost) timeout 500 python3 bench/gate_suite.py --out "$OUT/results" --only "$1" ;;
    walk:*) walk "${1#walk:}" ;;
    walkcase:*) walkcase "${1#walkcase:}" ;;
    # each lane judges its share of the guessed states (lane i of n: states i, i+n, ...); no walk
    prefetch:*) walk "${1#prefetch:}" --prefetch-only --prefetch-share "${LANE:-0}/${LANES:-1}" ;;
    bias:*) local spec=${1#bias:}; local rest=${spec#*:}  # bench/timing_bias.py probe on bench/walks/NAME.gpu.json.gz
      local steps=${rest%%:*} placement=as_loaded; [[ $rest == *:* ]] && placement=${rest#*:}
      timeout "${limit:-300}" python3 bench/timing_bias.py probe "bench/walks/${spec%%:*}.gpu.json.gz" ${steps//,/ } \
        --placement "$placement" ;;
    retime:*) local spec=${1#retime:}; local name=${spec%%:*} steps=""  # each lane its share of the steps
      [[ $spec == *:* ]] && steps=${spec#*:}
      local walk=bench/walks/$name.gpu.json.gz; [ -f "$walk" ] || walk=corpus/lineages/$name.gpu.json
      timeout "${limit:-300}" python3 bench/retime.py "$walk" --share "${LANE:-0}/${LANES:-1}" ${steps:+--steps "$steps"} ;;
    percase:*) local spec=${1#percase:}; local name=${spec%%:*} steps=""  # each lane its share of the steps
      [[ $spec == *:* ]] && steps=${spec#*:}
      local walk=corpus/lineages/$name.gpu.json; [ -f "$walk" ] || walk=bench/walks/$name.gpu.json.gz
      local share_var=PERCASE_SHARE_${LANE:-} share=${LANE:-0}/${LANES:-1}  # named steps: all of them
      [ -n "$steps" ] && share=0/1
      timeout "${limit:-${PERCASE_TIMEOUT:-540}}" python3 bench/percase.py "$walk" --share "${!share_var:-$share}" \
        --per-card "${PERCASE_PER_CARD:-0}" --placement "${PERCASE_PLACEMENT:-as_loaded}" ${steps:+--steps "$steps"} \
        ${PERCASE_LIBRARY:+--library "$PERCASE_LIBRARY"} ;;
    placement:*) local spec=${1#placement:}
      timeout "${limit:-300}" python3 bench/timing_bias.py placement "bench/walks/${spec%%:*}.gpu.json.gz" "${spec#*:}" ;;
    sweep:*) timeout "${limit:-${SWEEP_TIMEOUT:-300}}" python3 bench/carrier_sweep.py "bench/sweeps/${1#sweep:}.toml" \
      --out "$OUT/results/sweep-${1#sweep:}.json" ;;
    admit) local library=$OUT/library${LANE:+-$LANE}.json  # join lanes: build --keep-trials A --keep-trials B
      local lane_cards=ADMIT_CARDS_${LANE:-} cards
      cards="${ADMIT_CARDS:-} ${!lane_cards:-}"
      # untried: the cards no trial has judged whose per-case effects say where they pay (preconditions_report.py)
      [ "${ADMIT_CARDS:-}" = untried ] && cards=$(python3 bench/preconditions_report.py --library "${ADMIT_FROM:-$library}" --untried)
      [ "${ADMIT_CARDS:-}" = untried ] && [ -z "${cards// /}" ] && { echo "admit: no untried card says where it pays"; return; }
      if [ -n "${ADMIT_FROM:-}" ]; then [ "$ADMIT_FROM" -ef "$library" ] || cp "$ADMIT_FROM" "$library"  # resume a library an earlier run cut short
      elif [ -f "$library" ]; then :  # a rebuild (or an admit) stage before this one wrote it
      else python3 -m klineage library build --out "$library" --keep-trials corpus/library/library.json \
        --note "built on the GPU host from corpus/lineages"; fi  # unchanged cards keep their trials: admit resumes
      # the budget stops starting cards a margin before the timeout, so that it never kills a card halfway
      local admit_s=${limit:-${ADMIT_TIMEOUT:-300}} walks  # the walks this call wrote source cards too
      # a card the rebuild renamed reads its trials' measurements from the library it was rebuilt from
      local measured=${ADMIT_MEASUREMENTS:-${REBUILD_TRIALS:-}}
      walks=$(echo ${ADMIT_LINEAGES:-} $(compgen -G "$OUT/lineages/*.gpu.json"))
      timeout "$admit_s" python3 -m klineage library admit --library "$library" --gate gpu --record \
        --limit "${ADMIT_LIMIT:-2}" --jobs "${ADMIT_JOBS:-6}" --budget-s "$(( admit_s - ${ADMIT_MARGIN:-30} ))" \
        --placement "${ADMIT_PLACEMENT:-as_loaded}" ${walks:+--lineages $walks} ${measured:+--measurements $measured} \
        $(for c in $cards; do printf -- '--card %s ' "$c"; done) ;;
    rebuild) python3 -m klineage library build $REBUILD_LINEAGES $(compgen -G "$OUT/lineages/*.gpu.json") --out "$OUT/library.json" \
      ${REBUILD_TRIALS:+--keep-trials "$REBUILD_TRIALS"} --note "${REBUILD_NOTE:-built on the GPU host from the walks REBUILD_LINEAGES names and those of this call}" ;;
    transfer:*) local ops=${1#transfer:} op  # a part per operator, written when it ends: a cut keeps the earlier ones
      local settings="--gate gpu --budget ${TRANSFER_BUDGET:-24} ${TRANSFER_STRATEGY:+--library-strategy $TRANSFER_STRATEGY}
        ${TRANSFER_RIVALS:+--rivals $TRANSFER_RIVALS} ${TRANSFER_ORDERING:+--ordering $TRANSFER_ORDERING}
        ${TRANSFER_LIBRARY:+--library $TRANSFER_LIBRARY}"
      if [ "$ops" = pending ]; then  # what no committed part measured on this card with these settings
        ops=$(python3 bench/transfer_eval.py --pending $(compgen -G "bench/results/transfer-parts/*.json";
                                                         compgen -G "bench/results/transfer-parts/*/*.json") $settings) || return
        echo "  pending on this GPU: ${ops:-none}"
      fi
      for op in ${ops//,/ }; do  # the limit is each operator's, and none runs past the deadline
        local op_limit=${limit:-540}
        if [ -n "${DEADLINE:-}" ]; then
          local left; left=$(deadline_left)
          if (( left < 30 )); then echo "  $op skipped: ${left} s left before the deadline"; continue; fi
          (( op_limit > left )) && op_limit=$left
        fi
        timeout "$op_limit" python3 bench/transfer_eval.py $settings --record --jobs "${TRANSFER_JOBS:-6}" --only "$op" \
          --out "$OUT/results/transfer/$op.json" --log "$OUT/results/transfer/$op.log.jsonl"
      done ;;
    skills:*) spec=${1#skills:}  # before *:*, which would take it for PROBLEM:KERNEL
      local lane_run_s=SKILLS_RUN_S_${LANE:-} lane_jobs=SKILLS_JOBS_${LANE:-} run_s
      run_s=${!lane_run_s:-${SKILLS_RUN_S:-}}
      timeout "${limit:-${SKILLS_TIMEOUT:-540}}" python3 bench/skills_eval.py --gate gpu --record --only "$spec" \
        --budget "${SKILLS_BUDGET:-12}" --jobs "${!lane_jobs:-${SKILLS_JOBS:-6}}" \
        --out "$OUT/results/skills-${spec//:/-}${SKILLS_HOLD_OUT:+-held-out}.json" \
        --log "$OUT/results/skills-${spec//:/-}${SKILLS_HOLD_OUT:+-held-out}.log.jsonl" \
        ${run_s:+--time-limit-s "$run_s"} ${SKILLS_HOLD_OUT:+--hold-out-operator} \
        --documents "$OUT/results/skills-docs${SKILLS_HOLD_OUT:+-held-out}" ;;
    *:*) timeout "${limit:-${GATE_TIMEOUT:-200}}" python3 -m klineage gate "${1%%:*}" "${1#*:}" --sanitize never --record ;;
    *) echo "unknown stage $1" ;;
  esac 2>&1
}

if [ "${1:-}" = --lanes ]; then
  shift; lanes=$#; cores=$(nproc); i=0
  for lane in "$@"; do
    ( export CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=$((cores / lanes)) LANE=$i LANES=$lanes
      for s in $lane; do stage "$s"; done ) > "$OUT/lane$i.txt" 2>&1 &
    i=$((i + 1))
  done
  wait
  for ((j = 0; j < i; j++)); do echo "##### lane $j"; grep -v '^\s*$' "$OUT/lane$j.txt" | tail -60; done
  lane_libraries=("$OUT"/library-*.json)  # lanes that admitted: one library, each card with its longest log
  if [ -f "${lane_libraries[0]}" ]; then
    python3 -m klineage library build --out "$OUT/library.json" --note "built on the GPU host from corpus/lineages" \
      $(for l in "${lane_libraries[@]}"; do printf -- '--keep-trials %s ' "$l"; done) && rm "${lane_libraries[@]}"
  fi
else
  for s in "$@"; do stage "$s" | tee -a "$OUT/log.txt" | tail -60; done
fi
find recorded -type f -newer /tmp/session-start | tar czf "$OUT/recorded.tgz" -T - && tar tzf "$OUT/recorded.tgz" | wc -l
# Only a few files come back from the host: results and lineages travel as one archive.
(cd "$OUT" && find results lineages -type f | tar czf results.tgz -T - && rm -rf results lineages && tar tzvf results.tgz)
ls -la "$OUT"

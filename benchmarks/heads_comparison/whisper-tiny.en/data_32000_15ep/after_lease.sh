#!/usr/bin/env bash
# Here, after `lease.sh wait` has packed the lease's results (run.tar.* under the call's files_at folder):
#   bash benchmarks/heads_comparison/whisper-tiny.en/data_32000_15ep/after_lease.sh FILES_AT
# unpacks them, keeps the comparison and data records beside this script, puts the exported heads in
# heads/whisper-tiny.en (the shipped recipe on more data: same shape, same draft vocabulary size), merges the GPU
# rows into benchmarks/real_speech/summary.json, measures the CPU rows again with the new heads (the commands of the
# rows they replace), updates the model card and draws the per-clip figure again. Each step writes its own files; a
# step that fails stops the script with what ran so far kept.
set -euo pipefail
FILES_AT=${1:?usage: after_lease.sh FILES_AT (the folder holding run.tar.00 ...)}
HERE=benchmarks/heads_comparison/whisper-tiny.en/data_32000_15ep
PY=.venv/bin/python
RUN=work_data/gpu_32k; rm -rf $RUN; mkdir -p $RUN
cat "$FILES_AT"/run.tar.* | tar -x -C $RUN
R=$RUN/results
cp $R/compare/comparison.* $R/compare/*_metrics.json $R/synth_info.json $R/plan.json $R/collect_info.json $HERE/
cp -r $R/artifact/. heads/whisper-tiny.en/
# the processor's files join at upload (pipeline.hub_folder), as for every committed artifact
rm -f heads/whisper-tiny.en/{processor_config,tokenizer,tokenizer_config}.json
for row in auto chain tree-32; do
  rm -rf benchmarks/real_speech/gpu_tiny.en_$row && cp -r $R/gpu_tiny.en_$row benchmarks/real_speech/
  $PY -m tools.benchmark --merge-summary benchmarks/real_speech/gpu_tiny.en_$row/results.json \
      --summary benchmarks/real_speech/summary.json
done
CPU="$PY -m tools.benchmark --audio work_data/eval_speech/manifest.jsonl --repeats 3 --summary benchmarks/real_speech/summary.json --quiet --model heads/whisper-tiny.en"
$CPU --draft auto --out benchmarks/real_speech/cpu_tiny.en_auto
$CPU --draft chain --out benchmarks/real_speech/cpu_tiny.en_chain
$CPU --draft chain --timestamps --no-plot --out benchmarks/real_speech/cpu_tiny.en_chain_timestamps
$CPU --draft tree --out benchmarks/real_speech/cpu_tiny.en_tree
$PY -m pipeline.update_card heads/whisper-tiny.en benchmarks/real_speech/gpu_tiny.en_{auto,chain,tree-32}/results.json \
    benchmarks/real_speech/cpu_tiny.en_{auto,chain,tree}/results.json
$PY -m tools.plot_lengths benchmarks/real_speech/{gpu,cpu}_{tiny.en,base}_auto/results.json \
    --out benchmarks/real_speech/speedup_vs_length.png
echo "then: the replayed chain stop (benchmarks/round_cost/README.md, chain_confidence.py), the quantised tiny.en rows"
echo "(benchmarks/quantised/gpu_w4a16_lease.sh; the CPU rows' commands in benchmarks/quantised/summary.json), README and"
echo "docs/RESULTS.md figures, and the GPU rows not re-measured by the lease (tree-16, tree-64, batches) marked as the old heads'"

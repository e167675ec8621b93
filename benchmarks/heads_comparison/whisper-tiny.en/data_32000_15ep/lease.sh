#!/usr/bin/env bash
# tiny.en data scaling on the lent GPU: 32 000 utterances, one lease, calls back to back (a warm machine keeps /tmp
# for 30 s after each call). The work itself runs in the background (pipeline.sh), so no call's 600 s limit cuts it:
#   bash lease.sh start        carrying .gpu/bd and .gpu/t1_tokenizer.json: unpack, start pipeline.sh
#   bash lease.sh carry t1     carrying .gpu/t1, then t2, t3: the base's float16 parts, made here with
#                              python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/t --parts 3
#                              (with .gpu/t1/tokenizer.json moved to .gpu/t1_tokenizer.json: each call under 64 MiB)
#   bash lease.sh wait         until the pipeline ends (or 560 s), printing its log
#   bash lease.sh pack         its results as one tar in 15 MiB parts under $OUT (here: cat run.tar.* | tar -x)
# As run on 2026-12-04: not to the end. The synthesis ran (32 000 utterances in 298 s, 107 utterances/s), then the
# parts carried were of an older layout that tools.carry_weights cannot join (since re-split as above) and, while
# they were carried again, the lent machine was taken back with /tmp; what is left of a 30-minute lease does not fit
# a second run (synthesis ~300 s, collection ~480 s at 67 clips/s, training ~300 s per variant, two rows ~130 s).
set -euo pipefail
W=/tmp/w; HERE=benchmarks/heads_comparison/whisper-tiny.en/data_32000_15ep
case "${1:?usage: lease.sh start|carry PART|wait|pack}" in
  start)
    mkdir -p $W/parts; cp -r .gpu/bd/. $W/bd/; cp .gpu/t1_tokenizer.json $W/tokenizer.json
    cp -r . $W/repo  # the background job outlives this call's copy of the tree
    cd $W/repo && setsid nohup bash $HERE/pipeline.sh > $W/pipeline.log 2>&1 < /dev/null &
    sleep 25; cat $W/pipeline.log ;;
  carry)
    cp -r ".gpu/${2:?usage: lease.sh carry PART}" $W/parts/
    [ -d $W/parts/t1 ] && [ -d $W/parts/t2 ] && [ -d $W/parts/t3 ] && touch $W/parts/ready
    ls $W/parts; tail -n 3 $W/pipeline.log ;;
  wait)
    for _ in $(seq 112); do [ -f $W/ended ] && break; sleep 5; done
    cat $W/pipeline.log | grep -v "it/s\]" | tail -n 40 ;;
  pack)
    tar -C $W -cf $W/run.tar results; split -b 15M -d $W/run.tar $OUT/run.tar.; ls -la $OUT ;;
esac

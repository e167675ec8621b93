#!/usr/bin/env bash
# whisper-base data scaling on the lent GPU, call 1 of 4 (carrying .gpu/bd): synthesise 24 000 utterances into
# /tmp/w/speech, in the background so that the base's weights can arrive meanwhile (call 2).
# .gpu/bd holds what the GPU image lacks: the wheels of soundfile, soxr, cffi, pycparser, jiwer and rapidfuzz,
# flite (`python -m pipeline.synth_speech --make-flite-bundle`, tar.xz), the sentences (`--export-sentences`, xz),
# the 28 real recordings (eval/, FLAC) and Whisper's English spelling table.
set -euo pipefail
W=/tmp/w; mkdir -p $W; cp -r .gpu/bd/. $W/bd/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/bd/*.whl
tar -C $W -xJf $W/bd/flite.tar.xz; xz -dc $W/bd/sentences.txt.xz > $W/sentences.txt; cp $W/bd/sentences.txt.source.json $W/
cp -r . $W/repo  # the background job outlives this call's copy of the tree
cd $W/repo && PYTHONPATH=/tmp/site:$W/repo PYTHONUNBUFFERED=1 setsid nohup python3 -m pipeline.synth_speech --out $W/speech \
    --num-utterances 24000 --workers 15 --flite-bin $W/flitebundle/bin/flite --text-file $W/sentences.txt \
    --voices slt:3,rms:2,awb:2,kal16:2,kal:1 --quiet > $W/synth.log 2>&1 < /dev/null &
sleep 20; cat $W/synth.log; ls $W/speech | head

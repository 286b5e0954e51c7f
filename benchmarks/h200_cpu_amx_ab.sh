export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlmin/*.whl || exit 1
mkdir -p /tmp/nb && { [ -d /tmp/nb/numba ] || tar -xJf .nbs/nb-site.tar.xz -C /tmp/nb || exit 1; }
mkdir -p /tmp/m && PYTHONPATH=/tmp/nb:/tmp/site:$PWD python3 -c "
import sys; from pathlib import Path; from oxinfer.bench import synthetic_model
for s in sys.argv[1].split(','):
    if not Path(f'/tmp/m/{s}.gguf').exists(): synthetic_model(s, Path('/tmp/m')).rename(f'/tmp/m/{s}.gguf')" ${SHAPES:-135m,1b} 2>&1 | tail -1
cp -r .old /tmp/oldpkg
for r in 1 2; do for s in ${SHAPES//,/ }; do for pkg in old new; do
  root=$PWD; [ $pkg = old ] && root=/tmp/oldpkg
  echo "== round $r $s $pkg"
  PYTHONPATH=/tmp/nb:/tmp/site:$root OXINFER_CPU_DECODE=numba timeout 200 python3 benchmarks/cpu_amx_prompt.py --model /tmp/m/$s.gguf \
    --lengths ${LENGTHS:-512} --rounds ${ROUNDS:-3} 2>&1 | grep -E "tok/s|kind|rror" | cut -c1-250
done; done; done

#!/bin/bash
# The device tool's carried folders (git-ignored; the lent machine has Python 3.12 and reaches no package index),
# built on this machine from PyPI and Debian, from the repository root (session 52 rebuilt them this way, ~5 min):
#   .gl      the Vulkan loader and libglvnd debs (the device README's recipe)
#   .whl     wgpu, gguf, structlog, cffi, pycparser, llguidance wheels for cp312 (h200_setup.sh installs them)
#   .whlmin  gguf and structlog alone (a CPU run)
#   .nbs     nb-site.tar.xz: numba 0.68.1 and llvmlite 0.50.0 for cp312, less numba/cuda, libllvmlite.so stripped, xz -9e
#   .lcp     lcp-trim.tgz: llama-cpp-python 0.3.36's sdist less .git, tests, docs, media, examples and the GPU backends
# Together ~50 MiB of a call's 64 MiB. Each folder is skipped where it exists.
set -e
ROOT=$PWD; T=$(mktemp -d)
GIT_DIR=$(git rev-parse --git-dir); mkdir -p $GIT_DIR/info
for d in .gl .whl .whlmin .nbs .lcp; do grep -qx "/$d/" $GIT_DIR/info/exclude 2>/dev/null || echo "/$d/" >> $GIT_DIR/info/exclude; done
DL="pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64
    --platform manylinux_2_31_x86_64"
if [ ! -d .gl ]; then
  mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
[ -d .whl ] || $DL -d .whl wgpu==0.32.0 gguf==0.19.0 structlog cffi pycparser 'llguidance>=1.7'
[ -d .whlmin ] || { mkdir -p .whlmin; cp .whl/gguf-*.whl .whl/structlog-*.whl .whlmin/; }
if [ ! -d .nbs ]; then
  $DL -d $T/nbw numba==0.68.1 llvmlite==0.50.0
  mkdir -p $T/site .nbs; (cd $T/site && for w in $T/nbw/*.whl; do unzip -q -o $w; done && rm -rf numba/cuda \
    && strip --strip-unneeded llvmlite/binding/libllvmlite.so && tar -cf - . | xz -9e -T2 > $ROOT/.nbs/nb-site.tar.xz)
fi
if [ ! -d .lcp ]; then
  pip download -q --no-deps --no-binary=:all: -d $T llama-cpp-python==0.3.36
  (cd $T && tar xzf llama_cpp_python-0.3.36.tar.gz && mv llama_cpp_python-0.3.36 llama_cpp_python-0.3.36-trim \
    && cd llama_cpp_python-0.3.36-trim && rm -rf .git .github examples docker vendor/llama.cpp/.github \
    && cd vendor/llama.cpp && rm -rf models docs tests benches examples tools/ui tools/server/tests media .git \
       tools/mtmd/test-*.mp4 ggml/src/ggml-{cuda,vulkan,metal,sycl,cann,hip,musa,opencl,hexagon,webgpu,zdnn,zendnn,openvino,virtgpu,et})
  mkdir -p .lcp; tar czf .lcp/lcp-trim.tgz -C $T llama_cpp_python-0.3.36-trim
fi
rm -rf $T; du -shc .gl .whl .whlmin .nbs .lcp

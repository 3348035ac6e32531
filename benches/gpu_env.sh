# The GPU machine's environment for kiln's bundled binaries: CUDA's and
# PyTorch's nvidia libraries on the loader path, the kernel cache in the
# checkout, insta reading snapshots here, and KILN_REQUIRE_CUDA=1 (a CUDA
# test that finds no GPU fails instead of skipping). Sourced by
# gpu_session.sh; a one-off call sources it too: `source benches/gpu_env.sh`.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
for d in $(python3 -c 'import nvidia,os;print(" ".join(os.path.join(p,"lib") for p in [os.path.join(nvidia.__path__[0],x) for x in os.listdir(nvidia.__path__[0])]))' 2>/dev/null); do
  LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$PWD/.kcache}
export INSTA_WORKSPACE_ROOT=$PWD INSTA_UPDATE=no KILN_REQUIRE_CUDA=1

# Sourced by the scripts that run Python from .venv (bootstrap.sh, test.sh, veena-tts.sh).
# The environment is installed without compiled bytecode: uv links its ~4.7 GB of packages
# from its cache in seconds, where compiling all ~27k modules took longer than pip's whole
# install. Python compiles a module the first time it is imported and keeps the result;
# where PYTHONDONTWRITEBYTECODE forbids writing it beside the sources, it is kept under
# .cache/pycache instead (PYTHONPYCACHEPREFIX), or every process would compile torch and
# vLLM again (~15 s of CPU per engine start).
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ -z "${PYTHONPYCACHEPREFIX:-}" ]; then
  export PYTHONPYCACHEPREFIX="${ROOT:-$PWD}/.cache/pycache"
  unset PYTHONDONTWRITEBYTECODE
fi

"""`torchft_lighthouse FLAGS` as `python tests/reliability/lighthouse.py FLAGS`, without importing
torch: torchft's script runs `lighthouse_main()` of the Rust extension torchft._torchft, which
is loaded here from its file, skipping the torchft package's __init__ (it imports torch: about
2 s of CPU per start on CI's cores against 0.03 s, for a server that never touches it; the suite
starts about 7). The server and its flags are the script's. Run as a file, as the script is:
`lighthouse_main` reads the process's own command line past the interpreter (`python -c CODE`
would hand it CODE as a flag)."""

import importlib.util
import pathlib
import sys

if __name__ == "__main__":
    folder = pathlib.Path(importlib.util.find_spec("torchft").submodule_search_locations[0])
    (path,) = folder.glob("_torchft.*.so")
    spec = importlib.util.spec_from_file_location("torchft._torchft", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "--check-no-torch" in sys.argv:  # tests/reliability/test_fault_tolerance.py
        sys.exit(1 if "torch" in sys.modules else 0)
    sys.exit(module.lighthouse_main())

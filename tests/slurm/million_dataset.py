"""The 1.3-million-file dataset of the long test (slurm.jobwide_million):
1,300 folders of 1,000 files of 512 random bytes (seeded), in the Slurm
tests' data area, made once and kept (a .done marker beside it).
    /usr/bin/python3 tests/slurm/million_dataset.py     (as root; prints the time)"""
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurmtest as st  # noqa: E402

NAME = "million"
FOLDERS = 1300
PER_FOLDER = 1000
SIZE = 512
SEED = 25


def path(i):
    """The dataset-relative path of file i (0 <= i < FOLDERS * PER_FOLDER)."""
    return f"d{i // PER_FOLDER:04d}/f{i % PER_FOLDER:04d}.bin"


def dataset():
    """The dataset's root, made (world-readable) unless its marker says it is there."""
    root = os.path.join(st.DATA, NAME)
    done = root + ".done"
    if os.path.exists(done):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(st.DATA, exist_ok=True)
    os.chmod(st.DATA, 0o755)
    old = os.umask(0o022)
    try:
        os.mkdir(root, 0o755)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        for folder in range(FOLDERS):
            d = os.path.join(root, f"d{folder:04d}")
            os.mkdir(d, 0o755)
            block = random.Random(SEED * 100003 + folder).randbytes(SIZE * PER_FOLDER)
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for k in range(PER_FOLDER):
                    fd = os.open(f"f{k:04d}.bin", flags, 0o644, dir_fd=dfd)
                    os.write(fd, block[k * SIZE:(k + 1) * SIZE])
                    os.close(fd)
            finally:
                os.close(dfd)
    finally:
        os.umask(old)
    open(done, "w").close()
    return root


if __name__ == "__main__":
    t = time.monotonic()
    made = not os.path.exists(os.path.join(st.DATA, NAME) + ".done")
    root = dataset()
    print(f"{root}: {FOLDERS * PER_FOLDER} files of {SIZE} B in {FOLDERS} folders, "
          f"{'made' if made else 'already there'} in {time.monotonic() - t:.1f} s")

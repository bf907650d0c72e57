"""build_tree.py DIR DEPTH ENTRIES: what a hostile job leaves for its end to
clean up, built in DIR: a chain of DEPTH directories named by 255
characters each, and a flat directory of ENTRIES entries (hard links to
16 files, 62,500 links each at most for a million: ext4 allows 65,000).
Prints what it made."""
import os
import sys

top, depth, entries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(top, 0o700)
d = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
os.mkdir("chain", dir_fd=d)
cur = os.open("chain", os.O_RDONLY | os.O_DIRECTORY, dir_fd=d)
for i in range(depth):
    name = chr(ord("a") + i % 26) * 255
    os.mkdir(name, dir_fd=cur)
    nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
    os.close(cur)
    cur = nxt
os.close(cur)
os.mkdir("flat", dir_fd=d)
flat = os.open("flat", os.O_RDONLY | os.O_DIRECTORY, dir_fd=d)
sources = 16
for s in range(sources):
    os.close(os.open(f"s{s}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=flat))
for i in range(entries - sources):
    os.link(f"s{i % sources}", f"e{i}", src_dir_fd=flat, dst_dir_fd=flat)
print(f"chain {depth} levels of 255-character names, flat {entries} entries")

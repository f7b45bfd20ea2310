#!/usr/bin/env python3
"""Run a command on a pseudo-terminal COLS columns wide and print what it wrote, escapes stripped.

  python3 tools/gpu_vllm/tty_capture.py COLS CMD [ARG...]      (exit code: the command's)

servescope renders tables at the terminal's width only on a terminal (piped, it never wraps), so the text a
user sees at 80 or 200 columns needs a terminal; TERM=dumb, NO_COLOR=1 and COLUMNS=COLS are set for it.
"""
import fcntl
import os
import pty
import re
import struct
import sys
import termios

cols, cmd = int(sys.argv[1]), sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(COLUMNS=str(cols), LINES="50", TERM="dumb", NO_COLOR="1")
    os.execvp(cmd[0], cmd)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
chunks = []
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    chunks.append(data)
_, status = os.waitpid(pid, 0)
text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
sys.stdout.write(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text))
sys.exit(os.waitstatus_to_exitcode(status))

"""A flood against a running multi-node job's peer port (issue 23): while the
job reads its dataset on the 3 namespaced nodes, a process of another user
(monarchtest2), without the job's key, inside the first node's network (an
address of the job's own nodes: the address filter lets it through) floods
that node's stager's front door for 20 s with the raw stranger of the unit
tests (tests/unit/peers_peer.cpp, flood: from 4 threads, connections closed
at once, garbage, wrong Proofs, stalled Proofs, idle connections). The stager's
memory stays within RSS_BOUND of what it held before, the job's ranks read
the right bytes, and no node gave another up."""
import os
import socket
import subprocess
import time

import slurmtest as st
import test_jobwide as jw

ATTACKER = "monarchtest2"
FLOOD_S = 20
RSS_BOUND = 64 << 20  # what the stager may hold more during the flood
FLOODER = os.path.join(os.environ.get("MONARCH_BUILD", os.path.join(st.SRC, "build")),
                       "tests", "unit", "monarch_peers_peer")


def listening(pid):
    """(port, IPv4 address) of each TCP socket the process listens on, in its
    network namespace, by port."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    table = subprocess.run(["nsenter", "-t", str(pid), "-n", "cat", "/proc/net/tcp"],
                           capture_output=True, text=True).stdout.splitlines()[1:]
    found = []
    for line in table:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:
            address, port = f[1].split(":")
            found.append((int(port, 16), socket.inet_ntoa(bytes.fromhex(address)[::-1])))
    return sorted(found)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


class Flood(jw.JobWideCase):
    # test_jobwide's job, dataset and reports; none of its tests.
    def test_flood_without_the_key(self):
        if not os.access(FLOODER, os.X_OK):
            self.skipTest(f"no {FLOODER} (build the unit tests)")
        seen = {}

        def flood(job, work):
            st.wait_for(lambda: any(True for _ in st.stagers(job)), 60, "the stagers")
            first = None
            for s in st.stagers(job):
                host = subprocess.run(["nsenter", "-t", str(s["pid"]), "-u", "hostname"],
                                      capture_output=True, text=True).stdout.strip()
                if host == st.MULTI[0]:
                    first = s["pid"]
            self.assertIsNotNone(first, "the first node's stager")
            # Its front door: a port of peer_ports (7400-7899 here), below
            # the ephemeral ports UCX's own listener takes.
            # It listens on its node's address, which the flood comes from;
            # a stager that runs has not always opened it yet.
            st.wait_for(lambda: listening(first), 60, "the first node's stager to listen")
            port, address = listening(first)[0]
            port = str(port)
            before = rss(first)
            flooder = subprocess.Popen(
                ["nsenter", "-t", str(first), "-n", "--", st.RUNUSER, "-u", ATTACKER, "--",
                 FLOODER, "flood", port, str(FLOOD_S)],
                env={"PATH": "/usr/bin:/bin", "MONARCH_PEER_ADDRESS": address, "UCX_TLS": "tcp"},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            peak = before
            while flooder.poll() is None:
                if os.path.exists(f"/proc/{first}"):
                    peak = max(peak, rss(first))
                time.sleep(0.05)
            out, err = flooder.communicate()
            seen.update(before=before, peak=peak, alive=os.path.exists(f"/proc/{first}"),
                        flooder=out + err)

        epochs, before, job, work = self.run_job("flood", during=flood)
        print(f"flood: stager RSS {seen['before'] >> 20} MiB before, peak {seen['peak'] >> 20} "
              f"MiB; {seen['flooder'].strip()}")
        self.assertIn("flooding", seen["flooder"])
        self.assertTrue(seen["alive"], "the first node's stager died during the flood")
        self.assertLess(seen["peak"] - seen["before"], RSS_BOUND)
        stats = self.reports(job, work)
        for host, s in stats.items():
            self.assertEqual(s["totals"]["stager"]["peers_failed"], 0, host)


if __name__ == "__main__":
    st.main()

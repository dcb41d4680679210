package doctor

import (
	"errors"
	"fmt"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"strings"
)

const noRDMARemedy = "load the RDMA core and the NIC's RDMA driver (modprobe ib_core ib_uverbs rdma_ucm and mlx5_ib, irdma, bnxt_re or rdma_rxe), " +
	"or keep rdma-netns off nodes without RDMA NICs (nodeSelector on the network attachment's pods)"

// modeFindings checks the netns mode; it returns false when the kernel
// has no RDMA subsystem at all, so the caller can skip what needs one.
func modeFindings(fs *Findings, k Kernel) (mode string, err error) {
	mode, err = k.NetnsMode()
	switch {
	case err != nil && isNoRDMA(err):
		fs.add(Fail, "rdma-subsystem", "node",
			fmt.Sprintf("the kernel has no RDMA subsystem loaded: RDMA netlink answers %q (ib_core is not loaded, or not built into this kernel), so this node has no RDMA devices to give to pods",
				strings.TrimPrefix(err.Error(), rdmans.ErrNoRDMA.Error()+": ")),
			noRDMARemedy)
	case err != nil:
		fs.add(Fail, "netns-mode", "node", fmt.Sprintf("cannot read the RDMA netns mode: %v", err),
			"run the doctor as root in the host network namespace; check that ib_core is loaded (lsmod | grep ib_core)")
	case mode == rdmans.ModeExclusive:
		fs.add(OK, "netns-mode", "node", "the RDMA subsystem is in exclusive netns mode: each RDMA device belongs to one network namespace", "")
	default:
		fs.add(Fail, "netns-mode", "node",
			fmt.Sprintf("the RDMA subsystem is in %s netns mode: every netns sees every RDMA device, so rdma-netns cannot give a device to one pod", mode),
			"add \"options ib_core netns_mode=0\" to /etc/modprobe.d/ib_core.conf (or ib_core.netns_mode=0 on the kernel command line) and reboot; "+
				"or run \"rdma system set netns exclusive\" before any network namespace exists (early at boot, before the container runtime starts)")
	}
	return mode, err
}

// persistFindings checks that the netns mode the node runs in, mode, is
// the one the next boot selects (next, set at where; "" where nothing does).
func persistFindings(fs *Findings, mode, where, next string) {
	switch {
	case mode == rdmans.ModeExclusive && next == rdmans.ModeExclusive:
		fs.add(OK, "netns-mode-persistent", "node", "exclusive mode is configured to survive a reboot ("+where+")", "")
	case mode == rdmans.ModeExclusive && next == rdmans.ModeShared:
		fs.add(Warn, "netns-mode-persistent", "node",
			"exclusive mode is set now, but "+where+" selects shared mode: after a reboot or an ib_core reload pods get no isolation",
			"set netns_mode=0 there")
	case mode == rdmans.ModeExclusive:
		fs.add(Warn, "netns-mode-persistent", "node",
			"exclusive mode is set now but not configured anywhere (no ib_core netns_mode in /etc/modprobe.d/*.conf or on the kernel command line): after a reboot or an ib_core reload the node is back in shared mode",
			"add \"options ib_core netns_mode=0\" to /etc/modprobe.d/ib_core.conf (and rebuild the initramfs if ib_core loads from it)")
	case mode == rdmans.ModeShared && next == rdmans.ModeExclusive:
		fs.add(Fail, "netns-mode-persistent", "node",
			where+" selects exclusive mode but the running kernel is in shared mode: the setting has not taken effect",
			"reboot the node (or reload ib_core and the RDMA drivers); if ib_core loads from the initramfs, rebuild it so it carries the option")
	}
}

func isNoRDMA(err error) bool { return errors.Is(err, rdmans.ErrNoRDMA) }

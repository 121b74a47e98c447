//! The machine's cross-CPU interrupt counts, from /proc/interrupts: what a page fault served on
//! another CPU, or a page taken out of a mapping another CPU has live, costs the whole machine.
//! The pager reports them per run (`--stats`) and `tidepool bench apps` per program run, for
//! every system.

/// Interrupt counts summed over every CPU, from /proc/interrupts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interrupts {
    /// Function-call interrupts (`CAL`): TLB shootdowns on most kernels, and other cross-CPU
    /// calls.
    pub function_call: u64,
    /// TLB shootdowns (`TLB`), where the kernel counts them apart.
    pub tlb_shootdown: u64,
    /// Rescheduling interrupts (`RES`): a thread woken on another CPU.
    pub reschedule: u64,
}

impl Interrupts {
    /// The machine's counts now; none where /proc/interrupts cannot be read.
    pub fn now() -> Option<Interrupts> {
        parse(&std::fs::read_to_string("/proc/interrupts").ok()?)
    }

    /// Cross-CPU interrupts: function calls and rescheduling. (The kernel counts a TLB
    /// shootdown under `TLB` and again under the function call that carries it.)
    pub fn cross_cpu(self) -> u64 {
        self.function_call + self.reschedule
    }

    /// What was taken since `earlier`.
    pub fn since(self, earlier: Interrupts) -> Interrupts {
        Interrupts {
            function_call: self.function_call.saturating_sub(earlier.function_call),
            tlb_shootdown: self.tlb_shootdown.saturating_sub(earlier.tlb_shootdown),
            reschedule: self.reschedule.saturating_sub(earlier.reschedule),
        }
    }
}

/// The `CAL`, `TLB` and `RES` rows of /proc/interrupts, each summed over its CPU columns; none
/// if none of the three is there (not x86, or not Linux).
fn parse(text: &str) -> Option<Interrupts> {
    let mut out = Interrupts::default();
    let mut found = false;
    for line in text.lines() {
        let Some((name, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let field = match name {
            "CAL" => &mut out.function_call,
            "TLB" => &mut out.tlb_shootdown,
            "RES" => &mut out.reschedule,
            _ => continue,
        };
        // Per-CPU counts, then the description.
        *field = rest
            .split_whitespace()
            .map_while(|w| w.parse::<u64>().ok())
            .sum();
        found = true;
    }
    found.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_rows_are_summed_over_cpus() {
        let text = "           CPU0       CPU1\n  0:         45          0   IO-APIC    2-edge      timer\n\
                    NMI:          0          0   Non-maskable interrupts\n\
                    RES:       5276       9112   Rescheduling interrupts\n\
                    CAL:      43751      33658   Function call interrupts\n\
                    TLB:       5053       5368   TLB shootdowns\n";
        assert_eq!(
            parse(text),
            Some(Interrupts {
                function_call: 43751 + 33658,
                tlb_shootdown: 5053 + 5368,
                reschedule: 5276 + 9112,
            })
        );
        assert_eq!(parse("  0: 1 2 timer\n"), None);
    }

    #[test]
    fn a_difference_never_goes_below_zero() {
        let a = Interrupts {
            function_call: 5,
            tlb_shootdown: 1,
            reschedule: 9,
        };
        let b = Interrupts {
            function_call: 7,
            tlb_shootdown: 1,
            reschedule: 2,
        };
        assert_eq!(
            a.since(b),
            Interrupts {
                function_call: 0,
                tlb_shootdown: 0,
                reschedule: 7,
            }
        );
    }
}

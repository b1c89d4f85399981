#include "commands/commands.h"

#include "format/bundle_reader.h"

#include <ostream>
#include <stdexcept>
#include <utility>

namespace kvscope::cli {

namespace {

// The commands that analyse: the app's demo, analyze, report, check, diff, whatif.
std::vector<Command> analysingCommands()
{
    return {
        {"demo", "demo [DIR] [--mla | --hybrid] [--capture-only]\n"
                 "  opens the app on the built-in demo capture, made in DIR (default ./kvscope-demo) on first\n"
                 "  use (the window shows it being made): a 24-layer model with a RoPE fault in layer 13;\n"
                 "  without a display, writes its HTML report into DIR/report and prints its analysis\n"
                 "  --mla           the MLA demo instead: 16 layers of DeepSeek-style latent attention (c_kv\n"
                 "                  256, k_pe 32) over TP 4, with a RoPE fault in k_pe of layer 9 (report:\n"
                 "                  DIR/report-mla)\n"
                 "  --hybrid        the hybrid demo instead: 12 Mamba2 layers alternating with 12 attention\n"
                 "                  layers over TP 4, with a stale recurrent state in layer 12 (report:\n"
                 "                  DIR/report-hybrid)\n"
                 "  --capture-only  make the capture (when missing) and stop\n",
         "open the app on the built-in demo capture (headless: write its report)", nullptr},
        {"analyze", "analyze BUNDLE|RESULTS.kvres [--json OUT.json] [--save RESULTS.kvres] [--prompt ID]... [--layers SPEC]\n"
                    "        [--threads N] [--strict] [--seed-bc] [--suspect-floor 6] [--suspect-drift-two-way 20]\n"
                    "        | analyze BUNDLE BUNDLE... | DIR [options]\n"
                    "  several bundles (or a folder's *.h5) are one sweep: every prompt pooled, named BUNDLE/ID; a\n"
                    "  bundle that cannot be read is left out with a warning (--strict: an error) (docs/scale-out.md)\n"
                    "  --json OUT     write every metric as strict JSON (docs/analysis-json.md)\n"
                    "  --save FILE    keep the analysis in a results file, written as it streams (docs/results-files.md);\n"
                    "                 analyze, check, report, diff and the app read it instead of the bundle\n"
                    "  --prompt ID    analyse this prompt only (repeatable)\n"
                    "  --layers SPEC  layers by index among the compared layers in model order, or by name,\n"
                    "                 e.g. 0-3,7\n"
                    "  --threads N    threads (default: one per core); one of them reads the next layer\n"
                    "  --strict       an unreadable block is an error instead of absent positions (without it,\n"
                    "                 what could not be read is named on the error stream too)\n"
                    "  --seed-bc      print the reference tool's combined BC per layer too (it reads ~1 on real\n"
                    "                 faults; a second pass over each layer); --json and --save always have it\n"
                    "  --suspect-floor, --suspect-drift-two-way  the suspects' thresholds, as for check and report\n",
         "compare engine and reference KV: a readable summary, or every metric as JSON", analyze},
        {"report", "report BUNDLE... | DIR -o DIR [--strict] [--min-bc 0.9] [--seed-bc] [--max-ratio 2.0] [--max-linf X] [--suspect-floor 6]\n"
                   "       [--no-whatif] [--against A]\n"
                   "  a self-contained HTML report (opens offline) with PNG images of each map (docs/reports.md),\n"
                   "  and what fp8 / int8 / int4 caches would cost (kvscope whatif's default schemes); several bundles\n"
                   "  (or a folder's) are one sweep, as for check\n"
                   "  --against A  BUNDLE compared with A (a capture, or its analysis JSON) first, as kvscope diff\n"
                   "               does: the regressions, the suspects of the change, B - A and both maps\n",
         "a self-contained HTML report with PNG maps", nullptr},
        {"check", "check BUNDLE... | DIR [--min-bc 0.9] [--seed-bc] [--max-ratio 2.0] [--max-linf X] [--suspect-floor 6]\n"
                  "      [--suspect-drift-two-way 20] [--max-kl X] [--json OUT] [--strict]\n"
                  "  for CI: exit 0 within the thresholds, 1 with the violations listed, 2 when the bundle is\n"
                  "  unreadable or invalid (docs/reports.md). --min-bc judges the combined BC against the\n"
                  "  noise floor; --seed-bc: the reference tool's BC instead. Several bundles (or a folder's)\n"
                  "  are one sweep: one that cannot be read fails (exit 1) and the rest are judged; --strict:\n"
                  "  exit 2 instead, nothing judged\n"
                  "  --max-kl X  judge the output instead of the floors: each prompt's next-token KL (nats) with\n"
                  "              the engine's KV in every layer, at every decode step, at most X (the bundle's\n"
                  "              impact record, docs/bundle-format.md; a prompt without one fails)\n",
         "pass/fail against thresholds, for CI", check},
        {"diff", "diff A B [--json OUT] [--max-worse 1.5] [--stat max|p99|median] [--threads N] [--suspect-floor 6]\n"
                 "  did B get worse than A? Two captures of the same prompts against the same reference (A may\n"
                 "  be A's analysis JSON), compared cell by cell in noise floors (docs/diff.md): per layer the\n"
                 "  statistic for A and B, the regressions first, where B is first worse, and the suspects of\n"
                 "  the change. Exit 0 when B is no worse, 1 with regressions, 2 on unreadable input or captures\n"
                 "  that do not match\n",
         "did an engine change make the KV cache worse? A/B in noise floors, for CI", diff},
        {"transfer", "transfer PRODUCER CONSUMER [--json OUT]\n"
                     "  two engine captures of the same requests, where the KV left (a prefill instance, the\n"
                     "  offloading side) and where it arrived, compared bit for bit, block by block (docs/transfer.md):\n"
                     "  which positions were transferred, missing, partial or extra; each changed block with a tested\n"
                     "  explanation (a layout read as another, a block offset, another request's block, a stale block,\n"
                     "  a conversion or scale, a block not written yet) or what was measured. A part stored in another\n"
                     "  dtype on the consumer is judged in that format's rounding. No reference needed. Exit 0 when\n"
                     "  identical, 1 when something changed, 2 when the captures cannot be compared\n",
         "did the KV arrive as it left? Both ends of a KV transfer compared bit for bit", transfer},
        {"whatif", "whatif BUNDLE [--schemes fp8_e4m3/tensor,fp8_e4m3/head,int8/token_head,int4/g32 | all] [--json OUT]\n"
                   "       [--maps] [--threads N] [--kl-budget NATS]\n"
                   "  what storing the reference KV (expected) in fp8, int8, int4 or NVFP4 would cost: per scheme and\n"
                   "  layer the median relative L2 error it adds, in bf16 noise floors of the same cells, the\n"
                   "  layers it hurts and why (docs/whatif.md). Schemes: fp8_e4m3|fp8_e5m2 /tensor /head\n"
                   "  /token_head, fp8_e4m3/vllm (amax/200 K, amax/100 V from the first prompt's prefill),\n"
                   "  int8/token_head, int4/g32 /g64 /g128 /gN, int4/kivi, int4/token_head_rht (vLLM's\n"
                   "  int4_per_token_head), nvfp4. --maps adds the layer x token\n"
                   "  maps to the JSON. Where the bundle measured the schemes' impact on the output (its impact\n"
                   "  record), each scheme's next-token KL per layer against bf16 noise, and a recipe for vLLM:\n"
                   "  --kv-cache-dtype and --kv-cache-dtype-skip-layers, each layer within --kl-budget (nats,\n"
                   "  median over decode steps; default: 10x the layer's bf16 noise and twice the typical\n"
                   "  layer's ratio, docs/whatif.md)\n",
         "what an fp8 / int8 / int4 KV cache would cost this model", whatif},
    };
}

// The commands that read, write or make bundles, and the benchmark.
std::vector<Command> bundleCommands()
{
    return {
        {"inspect", "inspect BUNDLE|RUN.kvres\n"
                    "  what a bundle holds; exit 0 when every layer of every prompt reconstructs, 1 if not,\n"
                    "  2 when the file is not a readable bundle; from its metadata and block tables, no KV value\n"
                    "  read (analyze and check verify every block's checksum). Of a results file: what it holds,\n"
                    "  what it was analysed with, and whether its bundle is at hand (exit 0 when it reads)\n",
         "what a bundle holds, and whether every layer reconstructs", inspect},
        {"import", "import DIR -o BUNDLE.h5\n"
                   "  a bundle from raw dumps: per-rank get_kv_caches .pt files, the config as JSON, block\n"
                   "  tables .pt, HF past_key_values as .pt or .safetensors, logits .pt (docs/import.md)\n",
         "a bundle from a folder of torch.save / safetensors dumps", importDumps},
        {"export", "export BUNDLE OUT.h5 [--prompt ID]... [--layers SPEC]\n"
                   "  the reconstructed, merged engine KV and the aligned references as float32\n"
                   "  [heads, seq, head_dim] with a presence mask, for other tools\n",
         "reconstructed KV as plain float32 arrays, for your own scripts", exportKv},
        {"synth", "synth OUT.h5 [options]\n"
                  "  --demo                 the built-in demo's shape (24 layers, 8 KV heads of 128, TP 4, 3\n"
                  "                         prompts, rope_offset fault); options after it override\n"
                  "  --layers N --hidden N --query-heads N --kv-heads N --head-dim N --ffn N --vocab N\n"
                  "  --window N             sliding window of the even layers (odd layers: full attention)\n"
                  "  --spec sliding|full|chunked  SlidingWindowSpec (blocks freed), FullAttentionSpec with\n"
                  "                         sliding_window, or ChunkedLocalAttentionSpec (chunks of --window)\n"
                  "  --state-space-layers L,L  these layers are a MambaSpec group, not captured (computed as\n"
                  "                         attention); with --hybrid, the Mamba2 layers (default: the even ones)\n"
                  "  --hybrid               a hybrid model: Mamba2 mixers alternating with attention, whose\n"
                  "                         recurrent state (conv and SSM, per TP rank as vLLM shards it) the\n"
                  "                         capture holds at every block boundary and the end of each run, with\n"
                  "                         the references'; after --demo, the hybrid demo\n"
                  "  --mamba-heads N --mamba-head-dim N --mamba-state N --mamba-groups N --mamba-conv N\n"
                  "                         the mixers' shape (default 8, 16, 16, 2, 4)\n"
                  "  --mamba-ssm-cache-dtype float32|bfloat16  the engine's SSM state (default float32)\n"
                  "  --mla                  an MLA model (DeepSeek's latent attention, one MLAAttentionSpec group):\n"
                  "                         c_kv 4 x head-dim, k_pe head-dim / 2 wide; after --demo, the MLA demo\n"
                  "  --kv-lora-rank N --rope-head-dim N   the MLA latent's widths (after --mla)\n"
                  "  --rope-scaling llama3  the model's RoPE scaled as Llama 3.1's (factor 8 over an original\n"
                  "                         context of 32 positions); none (default): unscaled\n"
                  "  --tp N --block-size N --sliding-block-size N\n"
                  "  --dcp N --cp-interleave N  decode context parallelism: N ranks of one head split its\n"
                  "                         positions, in runs of --cp-interleave (default 1)\n"
                  "  --kv-dtype D           the engine cache: bfloat16 (default), fp8_e4m3, fp8_e5m2,\n"
                  "                         fp8_e4m3fnuz or int8, with its own scales (amax / largest value);\n"
                  "                         vLLM's nvfp4, int4_per_token_head, fp8_per_token_head or\n"
                  "                         int8_per_token_head, quantised as vLLM does\n"
                  "  --kv-scale G           a quantised cache's scales: tensor (default), head or token_head\n"
                  "  --prompts 100,180,260  prompt lengths         --decode N   decode steps per prompt\n"
                  "  --two-way              no fp32 baseline       --seed N\n"
                  "  --engine-only          no reference KV at all: B of `kvscope diff A B`, borrowing A's\n"
                  "  --no-impact            without the impact record (the model decoding with the engine's\n"
                  "                         KV: docs/bundle-format.md \"Impact\"; over half of the demo's time)\n"
                  "  --threads N            prompts computed in parallel (default: one per core; same result)\n"
                  "  --fault KIND           none, or one of (docs/synth.md): rope_offset dead_head window_off_by_one\n"
                  "                         rope_prefill chunked_prefill rope_scaling rope_convention partial_rotary\n"
                  "                         stale_block shard_swap fp8_scale rank_v_scale global_v_scale head_swap\n"
                  "                         kv_swap block_shift lost_write batch_mixup prefix_reuse head_k_scale\n"
                  "                         lagging_write rank_unwritten k_negated scale_granularity\n"
                  "                         scale_other_layer replica_diff (one TP rank's copy of one block differs;\n"
                  "                         MLA or replicated heads) nan inf nan_expected (one value of K of\n"
                  "                         one head at one decode position: NaN, +inf, or NaN in the reference)\n"
                  "                         token_scale channel_scale qkv_bias clipped (magnitude, direction kept)\n"
                  "                         other_layer other_prompt (KV of another layer, another prompt)\n"
                  "                         window_short window_on_full_layers (a window of the wrong size or type)\n"
                  "                         layout_token_major layout_kv_halves layout_blocks_first (a layout\n"
                  "                         read wrong: in a rank's block, or K/V-first pages read blocks-first)\n"
                  "                         replica_wrong_head read_rank_wrong_head (replicated heads: a replica,\n"
                  "                         or a rank the analysis reads, holds the next head's KV)\n"
                  "                         state_stale state_other_request state_not_reset state_zeros\n"
                  "                         state_scale (--hybrid: a Mamba2 layer's state at one checkpoint, the\n"
                  "                         engine running on from it; step: the first checkpoint from there)\n"
                  "  --fault-layer N --fault-head N --fault-rank N --fault-step N   where it applies (step:\n"
                  "                         position - prompt_len, negative in the prefill)\n"
                  "  --provenance SPEC      record where each prompt position's KV came from, in order:\n"
                  "                         KIND[=CONNECTOR][:COUNT],... of prefill (chunks 0, 1, ...),\n"
                  "                         prefix_cache, external=NAME, recomputed, unknown (last: the rest);\n"
                  "                         positions after the prompt are decode steps\n"
                  "  --model-free           long captures in seconds: the same shape and prompts without the\n"
                  "                         transformer, random KV with the noise its two bf16 runs show (fault:\n"
                  "                         none, rope_offset or other_layer; bf16 sliding and full layers)\n"
                  "  --results LxT          OUT is a results file (.kvres) of L layers x T tokens, 8 KV heads,\n"
                  "                         made without a capture: a fixture for viewers at full size, such\n"
                  "                         as 80x131072 (--two-way and --seed apply)\n",
         "a capture from a small transformer, with an injectable engine fault (docs/synth.md)", synth},
        {"bench", "bench [--tokens 2048] [--layers 80] [--threads N] [--runs 3] [--dir DIR] [--keep] [--suspects]\n"
                  "      | bench --end-to-end BUNDLE [--threads N] [--runs 5]\n"
                  "  times the three-way analysis of a synthetic Llama-3.3-70B-shaped capture against a\n"
                  "  read-once roofline, at L and 2L layers; the suspects', the what-if's, analyze --save's\n"
                  "  and diff's cost. --end-to-end: whole kvscope processes on BUNDLE (inspect, analyze,\n"
                  "  analyze --json) against reading the bytes it needs once, and where the time goes.\n"
                  "  Past 16384 tokens (a long context): one capture, its analysis against the roofline,\n"
                  "  peak memory, analyze --save, and the app from the bundle and from the results file.\n"
                  "  --suspects: only the suspects' share of the analysis, clean and with faults that take\n"
                  "  their search through each path (whose KV: found, and nothing found)\n",
         "time the analysis against a read-once roofline", nullptr, true, "kvscope-bench"},
        {"bench-run", "bench-run roofline|analyze|whatif|save|phases|... BUNDLE THREADS\n", "one measurement of bench, in its own process",
         nullptr, false, "kvscope-bench"},
    };
}

}  // namespace

const std::vector<Command>& commands()
{
    static const std::vector<Command> table = [] {
        std::vector<Command> all = analysingCommands();
        for (Command& c : bundleCommands())
            all.push_back(c);
        return all;
    }();
    return table;
}

const Command* findCommand(const std::string& name)
{
    for (const Command& c : commands())
        if (name == c.name)
            return &c;
    return nullptr;
}

void printUsage(const std::string& name, std::ostream& out)
{
    if (const Command* c = findCommand(name))
        out << "usage: kvscope " << c->usage;
}

void addThresholdOptions(OptionParser& parser, Thresholds& thresholds)
{
    parser.flag("--seed-bc", [&thresholds] { thresholds.bcVsNoise = false; });
    parser.real("--min-bc", thresholds.minBc);
    parser.real("--max-ratio", thresholds.maxRatio);
    parser.real("--max-linf", thresholds.maxLinf);
    parser.real("--max-kl", thresholds.maxKl);
    addSuspectOptions(parser, thresholds.suspects);
}

void addSuspectOptions(OptionParser& parser, SuspectThresholds& suspects)
{
    parser.real("--suspect-floor", suspects.offFloor);
    parser.real("--suspect-drift-two-way", suspects.twoWayDrift);
}

namespace {
AnalysisShare* processShare = nullptr;
BundleProbe processProbe = BundleReader::kProbeFromThreads ? BundleProbe([](const std::string& path) {
    BundleReader::probeInChild(path);
}) : BundleProbe();
}  // namespace

const BundleProbe& bundleProbe()
{
    return processProbe;
}

void setBundleProbe(BundleProbe probe)
{
    processProbe = std::move(probe);
}

AnalysisShare* sharedAnalysis()
{
    return processShare;
}

void setSharedAnalysis(AnalysisShare* share)
{
    processShare = share;
}

void printOverview(std::ostream& out)
{
    out << "usage: kvscope [BUNDLE | RUN.kvres | DIR]\n"
           "                                  the desktop app (on a capture bundle, a saved analysis, or a folder of dumps)\n"
           "       kvscope COMMAND [ARGS]     (kvscope COMMAND --help: its options)\n"
           "       kvscope --version\n\ncommands:\n";
    for (const Command& c : commands())
        if (c.listed) {
            std::string name = c.name;
            name.resize(10, ' ');
            out << "  " << name << c.summary << "\n";
        }
    out << "\nCapture bundles are HDF5 files: docs/bundle-format.md. Where a command takes a BUNDLE to analyse, a\n"
           "results file (kvscope analyze BUNDLE --save RUN.kvres) stands for it: docs/results-files.md.\n";
}

}  // namespace kvscope::cli

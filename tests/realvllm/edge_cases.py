"""The edge cases of ``vllm serve``'s argument handling that the simulator is held to beside the
corpus (test_sim_parity.py), as data. Each case: ``name``, ``argv`` (the words after
``vllm serve``; ``{cwd}`` stands for the directory it runs in) and ``files`` (paths relative to
that directory and their text, made before it runs). :func:`edge_cases` gives each platform's:
the shared ones, then the platform's own."""

from __future__ import annotations

from typing import Any

MODEL = "Qwen/Qwen3-0.6B"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
Case = dict[str, Any]


def _case(name: str, *argv: str, files: dict[str, str] | None = None) -> Case:
    return {"name": name, "argv": list(argv), "files": dict(files or {})}


SHARED: list[Case] = [
    # the model: positional, --model, both, neither
    _case("positional model", MODEL),
    _case("no model (vLLM's default)"),
    _case("--model X", "--model", MODEL),
    _case("--model=X", f"--model={MODEL}", "--port", "8001"),
    _case("--model and a positional model", "other/model", "--model", MODEL),
    _case("--model without its value", "--port", "8001", "--model"),
    _case("--served-model-name without a positional model", "--served-model-name", "x"),
    _case("--served-model-name with --model", "--model", MODEL, "--served-model-name", "x", "y"),
    # tool-call parsers
    _case("known tool parser", MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
    _case(
        "unknown tool parser", MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "nosuch"
    ),
    _case("unknown tool parser without auto choice", MODEL, "--tool-call-parser", "nosuch"),
    _case("auto tool choice without a parser", MODEL, "--enable-auto-tool-choice"),
    _case(
        "unknown tool parser, headless",
        MODEL,
        "--headless",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "nosuch",
    ),
    # reasoning parsers
    _case("known reasoning parser", MODEL, "--reasoning-parser", "deepseek_r1"),
    _case("unknown reasoning parser", MODEL, "--reasoning-parser", "nosuch"),
    _case("unknown reasoning parser, headless", MODEL, "--headless", "--reasoning-parser", "x"),
    _case(
        "known reasoning parser in structured outputs",
        MODEL,
        "--structured-outputs-config",
        '{"reasoning_parser": "deepseek_r1"}',
    ),
    _case(
        "unknown reasoning parser in structured outputs",
        MODEL,
        "--structured-outputs-config.reasoning_parser",
        "nosuch",
    ),
    # dotted arguments
    _case("dotted --compilation-config.mode 3", MODEL, "--compilation-config.mode", "3"),
    _case("dotted -cc.mode=3", MODEL, "-cc.mode=3"),
    _case("dotted value True", MODEL, "--compilation-config.use_inductor_graph_partition", "True"),
    _case("dotted value 1k", MODEL, "--compilation-config.max_cudagraph_capture_size", "1k"),
    _case("dotted value 2M", MODEL, "--compilation-config.max_cudagraph_capture_size", "2M"),
    _case("dotted value 1.5K", MODEL, "--compilation-config.max_cudagraph_capture_size", "1.5K"),
    _case("dotted value auto", MODEL, "--compilation-config.mode", "auto"),
    _case("dotted value null", MODEL, "--compilation-config.mode", "null"),
    _case("dotted list with +", MODEL, "--compilation-config.cudagraph_capture_sizes+", "1,2,4"),
    _case("dotted unknown key", MODEL, "--compilation-config.nosuch", "1"),
    _case("dotted nested key", MODEL, "--compilation-config.pass_config.fuse_norm_quant", "true"),
    _case(
        "dotted after the flag's JSON",
        MODEL,
        "--compilation-config",
        '{"mode": 3}',
        "--compilation-config.cudagraph_mode",
        "FULL",
    ),
    _case(
        "dotted speculative ngram",
        MODEL,
        "--speculative-config.method",
        "ngram",
        "--speculative-config.num_speculative_tokens",
        "3",
    ),
    _case("dotted on a flag that is not JSON", MODEL, "--max-model-len.x", "3"),
    _case("dotted on an unknown flag", MODEL, "--nosuch-config.x", "3"),
    _case("dotted key without a value", MODEL, "--compilation-config.mode"),
    _case("dotted underscores before the dot", MODEL, "--compilation_config.mode", "3"),
    # JSON values
    _case("JSON compilation config unknown key", MODEL, "-cc", '{"mode": 3, "nosuch": 1}'),
    _case("JSON compilation config bare 1k", MODEL, "-cc", '{"max_cudagraph_capture_size": 1k}'),
    _case("JSON compilation config as an int", MODEL, "--compilation-config", "3"),
    _case("JSON compilation config invalid", MODEL, "--compilation-config", "{mode: 3"),
    _case("JSON attention config unknown key", MODEL, "--attention-config", '{"nosuch": true}'),
    _case(
        "JSON kv-transfer config unknown key",
        MODEL,
        "--kv-transfer-config",
        '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "nosuch": 1}',
    ),
    _case(
        "JSON speculative config unknown key",
        MODEL,
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "nosuch": 1}',
    ),
    _case("JSON speculative config invalid", MODEL, "--speculative-config", "{method: ngram}"),
    _case("JSON quantization config invalid", MODEL, "--quantization-config", "{bad"),
    _case("JSON model-loader-extra-config invalid", MODEL, "--model-loader-extra-config", "{bad}"),
    _case(
        "JSON structured outputs unknown key", MODEL, "--structured-outputs-config", '{"nosuch": 1}'
    ),
    _case("JSON wrong type", MODEL, "--compilation-config", '{"mode": "three"}'),
    _case("JSON override-generation-config invalid", MODEL, "--override-generation-config", "{"),
    _case(
        "JSON default-chat-template-kwargs invalid", MODEL, "--default-chat-template-kwargs", "x"
    ),
    # chat templates, in the directory the server runs in
    _case(
        "chat template relative path",
        MODEL,
        "--chat-template",
        "tmpl.jinja",
        files={"tmpl.jinja": TEMPLATE},
    ),
    _case(
        "chat template relative path in a folder",
        MODEL,
        "--chat-template",
        "./t/tmpl.jinja",
        files={"t/tmpl.jinja": TEMPLATE},
    ),
    _case(
        "chat template absolute path",
        MODEL,
        "--chat-template",
        "{cwd}/abs.jinja",
        files={"abs.jinja": TEMPLATE},
    ),
    _case("chat template missing relative", MODEL, "--chat-template", "missing.jinja"),
    _case("chat template missing absolute", MODEL, "--chat-template", "/nonexistent/t.jinja"),
    _case("chat template a directory", MODEL, "--chat-template", "tdir", files={"tdir/keep": ""}),
    _case("chat template inline", MODEL, "--chat-template", TEMPLATE),
    _case("chat template the wheel's", MODEL, "--chat-template", "template_chatml.jinja"),
    _case("chat template None", MODEL, "--chat-template", "None"),
    # spellings
    _case("--flag=value", MODEL, "--max-model-len=4096", "--port=8001"),
    _case("store-true flag given a value", MODEL, "--enforce-eager=1"),
    _case("boolean --no- flag", MODEL, "--no-enable-prefix-caching"),
    _case("underscores in a flag name", MODEL, "--max_model_len", "4096"),
    _case("underscores in a flag=value", MODEL, "--max_model_len=4096", "--tensor_parallel_size=1"),
    _case("-O3", MODEL, "-O3"),
    _case("-O 3", MODEL, "-O", "3"),
    _case("-O alone", MODEL, "-O"),
    _case("abbreviated flag", MODEL, "--max-model", "4096"),
    _case("ambiguous abbreviation", MODEL, "--max-num", "8"),
    # repeats
    _case("repeated flag", MODEL, "--max-model-len", "4096", "--max-model-len", "8192"),
    _case("repeated JSON flag", MODEL, "-cc", '{"mode": 3}', "--compilation-config", '{"mode": 0}'),
    _case("repeated dotted key", MODEL, "-cc.mode", "3", "-cc.mode", "0"),
    # help
    _case("--help", "--help"),
    _case("-h", MODEL, "-h"),
    _case("--help=ModelConfig", "--help=ModelConfig"),
    _case("--help=max-model-len", "--help=max_model_len"),
    _case("--help=nosuch", "--help=nosuch"),
    _case("--version after serve", MODEL, "--version"),
    # unknown flags, values and choices
    _case("unknown flag", MODEL, "--nosuch"),
    _case("unknown short flag", MODEL, "-x"),
    _case("--task (not a serve flag)", MODEL, "--task", "embed"),
    _case("--task=embed", MODEL, "--task=embed"),
    _case("extra positional", MODEL, "extra"),
    _case("invalid choice", MODEL, "--dtype", "nosuch"),
    _case("invalid int", MODEL, "--tensor-parallel-size", "two"),
    _case("invalid human-readable int", MODEL, "--max-model-len", "1.5K"),
    _case("human-readable max-model-len", MODEL, "--max-model-len", "32k"),
    _case("max-model-len auto", MODEL, "--max-model-len", "auto"),
    _case("port out of range", MODEL, "--port", "99999"),
    _case("missing value", MODEL, "--max-model-len"),
    _case("missing value before a flag", MODEL, "--tool-call-parser", "--enforce-eager"),
    _case("negative sse keep-alive", MODEL, "--sse-keep-alive-interval", "-1"),
    _case("log outputs without log requests", MODEL, "--enable-log-outputs"),
    _case(
        "per-request metrics without stats",
        MODEL,
        "--enable-per-request-metrics",
        "--disable-log-stats",
    ),
    _case("multi-port external lb, dp 1", MODEL, "--data-parallel-multi-port-external-lb"),
    _case("lora modules invalid JSON", MODEL, "--enable-lora", "--lora-modules", "{bad"),
    # config files
    _case("--config missing file", MODEL, "--config", "missing.yaml"),
    _case("--config not yaml", MODEL, "--config", "cfg.json", files={"cfg.json": "{}"}),
    _case(
        "--config yaml",
        MODEL,
        "--config",
        "cfg.yaml",
        files={"cfg.yaml": "max-model-len: 4096\nenforce-eager: true\n"},
    ),
    _case(
        "--config yaml with the model and a false bool",
        "--config",
        "cfg.yml",
        files={"cfg.yml": f"model: {MODEL}\nenforce-eager: false\n"},
    ),
    _case(
        "--config yaml without a model", "--config", "cfg.yaml", files={"cfg.yaml": "port: 8001\n"}
    ),
    _case(
        "--config yaml with a mapping",
        MODEL,
        "--config",
        "cfg.yaml",
        files={"cfg.yaml": "compilation-config:\n  mode: 3\n  nosuch: 1\n"},
    ),
    _case(
        "--config yaml with an unknown key",
        MODEL,
        "--config",
        "cfg.yaml",
        files={"cfg.yaml": "nosuch: 1\n"},
    ),
]

PLATFORM_ONLY: dict[str, list[Case]] = {
    "rbln": [
        _case("rbln flag", MODEL, "--rbln-num-devices-per-local-rank", "2"),
        _case("rbln boolean flag off", MODEL, "--no-rbln-use-custom-sampler"),
        _case("rbln invalid choice", MODEL, "--rbln-compile-dtype", "float32"),
        _case("rbln flag with underscores", MODEL, "--rbln_sub_block_size", "None"),
        _case(
            "additional-config repeated",
            MODEL,
            "--additional-config",
            '{"a": 1}',
            "--additional-config",
            '{"b": 2}',
        ),
    ],
    "upstream": [
        _case("rbln flag upstream", MODEL, "--rbln-num-devices-per-local-rank", "2"),
        _case("additional-config upstream", MODEL, "--additional-config", '{"a": 1}'),
    ],
}


def edge_cases(platform: str) -> list[Case]:
    """The edge cases of ``platform`` (``rbln`` or ``upstream``)."""
    return [dict(c, files=dict(c["files"])) for c in SHARED + PLATFORM_ONLY[platform]]

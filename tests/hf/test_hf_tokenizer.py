"""The exported tokenizer files tokenize exactly like the training tokenizer (tiktoken), and an
export from a Hugging Face tokenizer folder keeps what the source's users had: its chat
templates and its generation ids. Both shipped rank files: GPT-2's, as a GPT-2-vocabulary run
exports them, and grt_debug's gpt2_4k (the debug export)."""

import json

import pytest

from grt_titan.hf.tokenizer_files import write_tokenizer_files
from grt_titan.tokenizer import GPT2_4K_TIKTOKEN_PATH, GPT2Tokenizer

MIXED = [
    "Hello world",
    "Mr. Darcy's 10,000 a-year!\n\n\tCafé — naïve 東京 🙂  double  spaces\u3000end",
    "   leading spaces, trailing spaces   \r\n\r\n",
    "Numbers 3.14159, 1e-5, 2026-11-29, 0x7fff; code: def f(x): return x**2  # ok",
    "I'm, you're, they've, he'll, she'd, it's, 'quoted' \"double\" «guillemets»",
    "ÀÉÎÕÜ ßø łę čš ğı ﬁ ligature, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "emoji 👩‍👩‍👧‍👦🏳️‍🌈 and combining e\u0301 a\u0308",
    "a literal <|endoftext|> inside text, and <|endoftext|>",
    "-" * 70 + "\n" + "=" * 33 + " " * 17 + "x" * 301,
]


@pytest.fixture(scope="module")
def tokenizers(debug_export, tmp_path_factory):
    """GPT-2's ranks and the files an export derives from them (as `export-hf` writes them)."""
    from transformers import AutoTokenizer

    train = GPT2Tokenizer()
    folder = tmp_path_factory.mktemp("gpt2_tokenizer")
    write_tokenizer_files(folder, train.encoding._mergeable_ranks, model_max_length=1024)
    return train, AutoTokenizer.from_pretrained(str(folder))


def test_the_debug_export_tokenizes_as_its_run(debug_export):
    """grt_debug's tokenizer (GPT-2's first 4,096 ranks) through its export's files: the same
    ids, longer than GPT-2's for the same text, and its own EOS."""
    from transformers import AutoTokenizer

    train, hf = GPT2Tokenizer(GPT2_4K_TIKTOKEN_PATH), AutoTokenizer.from_pretrained(str(debug_export))
    for text in MIXED:
        assert hf(text)["input_ids"] == train.encode(text), text
        assert hf.decode(train.encode(text)) == text
    assert hf.eos_token_id == train.eos_id == 4096 and len(hf) == 4097
    assert len(train.encode(MIXED[1])) > len(GPT2Tokenizer().encode(MIXED[1]))


def test_ids_equal_on_mixed_text(tokenizers):
    train, hf = tokenizers
    for text in MIXED:
        assert hf(text)["input_ids"] == train.encode(text), text
        assert hf.encode(text) == train.encode(text)
    joined = "\n".join(MIXED)
    assert hf(joined)["input_ids"] == train.encode(joined)
    assert hf(MIXED)["input_ids"] == train.encode_batch(MIXED, num_threads=1)


def test_decode_and_special_tokens(tokenizers):
    train, hf = tokenizers
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == train.eos_id == 50256
    assert hf.bos_token_id == 50256 and len(hf) == train.get_vocab_size() == 50257
    for text in MIXED:
        assert hf.decode(train.encode(text)) == text
    # A literal "<|endoftext|>" in text is text (as in training), never the EOS id.
    assert train.eos_id not in hf("x <|endoftext|> y")["input_ids"]
    assert hf.decode([15496, 50256]) == "Hello<|endoftext|>"


# An instruct model's ChatML template (SmolLM2's, without its default system prompt) and a
# second, named one, as transformers saves them beside the tokenizer.
CHAT_TEMPLATES = {
    "default": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "tool_use": "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + '\\n' }}{% endfor %}",
}
CHAT = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello world"}]
# The source's generation_config.json: an EOS list (end of turn, end of text), as instruct models ship.
SOURCE_IDS = {"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 3}


@pytest.fixture(scope="module", params=[True, False], ids=["jinja_files", "tokenizer_config_key"])
def chat_export(request, native_models, tmp_path_factory):
    """(source tokenizer folder, export of the 512-token gpt2 model with it): the templates saved
    as chat_template.jinja + additional_chat_templates/ or as tokenizer_config.json's key."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from grt_titan.hf.convert import write_hf_folder

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "Hello", "world", "Be", "brief", "\n"]
    words += ["system", "user", "assistant", "[", "]"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = dict(unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    source = tmp_path_factory.mktemp("chat_source")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **specials)
    tok.chat_template = dict(CHAT_TEMPLATES)
    tok.save_pretrained(str(source), save_jinja_files=request.param)
    GenerationConfig(**SOURCE_IDS).save_pretrained(str(source))
    model = native_models["gpt2"]
    out = tmp_path_factory.mktemp("chat_export") / "grt"
    write_hf_folder(out, model.state_dict(), model.model_args, tokenizer_path=source)
    return source, out


def test_export_keeps_the_sources_chat_templates(chat_export):
    from transformers import AutoTokenizer

    source, out = chat_export
    want, got = (AutoTokenizer.from_pretrained(str(f), trust_remote_code=True) for f in (source, out))
    for name in (None, "tool_use"):
        kwargs = dict(tokenize=False, add_generation_prompt=True, chat_template=name)
        assert got.apply_chat_template(CHAT, **kwargs) == want.apply_chat_template(CHAT, **kwargs)
    assert got.apply_chat_template(CHAT, tokenize=False).startswith("<|im_start|>system\nBe brief<|im_end|>")
    for path in source.rglob("*"):  # every tokenizer file of the source, byte for byte
        if path.is_file() and path.name != "generation_config.json":
            assert (out / path.relative_to(source)).read_bytes() == path.read_bytes(), path.name


def test_export_keeps_the_sources_generation_ids(chat_export):
    _, out = chat_export
    generation = json.loads((out / "generation_config.json").read_text())
    assert {key: generation.get(key) for key in SOURCE_IDS} == SOURCE_IDS

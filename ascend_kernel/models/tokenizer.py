"""The tiny models' tokenizer: a byte-level BPE trained on a short embedded English text.

Every tiny model shares it, so prompts tokenize the same way for every
architecture, and it is built offline in well under a second. Byte-level BPE
covers any text (no ``<unk>``); the corpus makes ordinary English prompts
split into whole-word tokens, which keeps tests readable.
"""

from __future__ import annotations

from typing import Any

#: Target vocabulary of the BPE tokenizer; the corpus decides the exact size.
TOKENIZER_VOCAB_TARGET = 1000

#: The longest prompt plus output the tiny models accept.
MAX_POSITIONS = 512

SPECIAL_TOKENS: dict[str, str] = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

#: Simple role-prefixed chat format, so ``LLM.chat`` and ``apply_chat_template`` work too.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# Written for this module: plain English across common topics, so ordinary prompts
# ("The capital of France is", "Once upon a time") split into whole-word tokens.
_CORPUS = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
The capital of Spain is Madrid. The capital of Japan is Tokyo. The capital of England is London.
Paris is a large city on the river Seine, and many people visit it every year to see the museums.
Once upon a time, there was a little girl who lived in a small house near the forest with her mother.
Once upon a time, there was a little boy who wanted to see the sea, so he walked for many days.
Every morning the little girl went to the river to get water, and every evening she read a book.
One day she found a small bird under a tree. The bird could not fly, so she took it home and cared for it.
After a week the bird was strong again. It sang a happy song and flew back into the bright blue sky.
The quick brown fox jumps over the lazy dog. The lazy dog did not move, and the quick brown fox ran away.
The quick brown fox jumps over the lazy dog and the quick brown fox jumps again over the sleeping cat.
A computer is a machine that can follow a list of instructions called a program. Programs are written
by people in languages such as Python, and a model is a program that learns from data to make predictions.
Large language models read text as tokens and predict the next token, one step at a time, until they stop.
The weather today is warm and sunny, but tomorrow it will be cold, with rain in the morning and wind at night.
In the spring the trees grow new green leaves, in the summer the days are long, and in the winter it snows.
My favourite food is bread with cheese, and my brother likes apples, oranges, rice and fresh fish from the market.
The students sat in the classroom and listened to their teacher, who explained why the earth goes around the sun.
Water boils at one hundred degrees and freezes at zero degrees. The moon is smaller than the earth.
There are seven days in a week and twelve months in a year. The first month is January and the last is December.
He opened the door, looked outside, and said that the train would arrive at the station in ten minutes.
She asked what time it was, and he answered that it was almost four o'clock in the afternoon.
Science helps us understand the world: how plants grow, why the sky is blue, and what the stars are made of.
Music, art and stories have been part of human life for thousands of years, in every country and culture.
The old man sat by the window, drank his tea, and remembered the summer when he first learned to swim.
If you want to learn something new, start with small steps, practice every day, and do not be afraid to ask.
Numbers like one, two, three, four, five, six, seven, eight, nine and ten are used to count things.
The dog barked at the postman, the cat slept on the warm chair, and the children played games in the garden.
We went to the mountains for a holiday, climbed to the top, and saw the whole valley below us in the light.
"""


def build_tokenizer() -> Any:
    """Train the byte-level BPE on :data:`_CORPUS`; every encoded prompt starts with BOS, Llama-style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS[k] for k in ("unk_token", "bos_token", "eos_token", "pad_token")]
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_TARGET,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )

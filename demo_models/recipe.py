"""The demo pair's recipe: the tiny target's dimensions and the training and data constants that
``tiny_models`` (target, data) and ``train_draft`` (draft) both build from, measured on 2 CPU cores:
the pair trains in about 8 minutes (target ~4, draft ~3) and, served on SGLang 0.5.23 (chain, 3 steps,
greedy), has a mean accept length of 3.3-3.4 with the training layer ids, 2.7-2.8 with the seed's layer
mismatch."""

VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2

TARGET_DIMS = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
)

SEED = 1234
TARGET_STEPS = 480          # ~4 minutes on 2 idle CPU cores
TARGET_BATCH = 8
TARGET_SEQ_LEN = 128
TARGET_LR = 3e-3
VAL_EVERY_NTH_FILE = 20     # files 0, 20, 40, ... of the sorted list are validation text

N_TRAIN_SEQS = 800
N_HELDOUT_SEQS = 64
PROMPT_LEN_RANGE = (16, 48)      # prompt tokens after BOS, inclusive
CONTINUATION_LEN_RANGE = (64, 96)  # greedy tokens kept per sequence, inclusive

NUM_THREADS = 2

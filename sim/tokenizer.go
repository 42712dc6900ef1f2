package sim

import (
	"hash/fnv"
	"strings"
)

// The simulator's tokenizer and "model": deterministic, cheap, and the same
// on every engine, so that a prefill and a decode given the same body agree
// on the prompt's tokens (and so on its KV bytes) without talking.

// bosToken starts every tokenized text prompt.
const bosToken = 1

// vocabSize bounds the ids the tokenizer produces for text.
const vocabSize = 32000

// tokenize splits text on white space, then each word into chunks of at most
// four bytes; a chunk's id is its FNV-1a hash modulo the vocabulary. The
// BOS token comes first, so no prompt is empty.
func tokenize(text string) []int {
	out := make([]int, 0, 1+len(text)/4)
	out = append(out, bosToken)
	for _, w := range strings.Fields(text) {
		for len(w) > 0 {
			n := min(4, len(w))
			h := fnv.New32a()
			h.Write([]byte(w[:n]))
			out = append(out, 3+int(h.Sum32()%(vocabSize-3)))
			w = w[n:]
		}
	}
	return out
}

// words is the vocabulary the simulator generates from.
var words = [...]string{
	"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
	"while", "five", "boxing", "wizards", "pack", "my", "jugs",
}

// outputBase is the id of words[0]; generated ids are outputBase + index.
const outputBase = vocabSize

// outputToken returns the k-th generated token after a prompt whose last
// prefix hash is seed: its id, its text (a word and a space) and its
// logprob.
func outputToken(seed uint64, k int) (id int, text string, logprob float64) {
	i := int(mix64(seed+uint64(k)*0x9e3779b97f4a7c15) % uint64(len(words)))
	return outputBase + i, words[i] + " ", -float64(i%8+1) / 16
}

// inputLogprob is the logprob the "model" gives prompt token tok.
func inputLogprob(tok int) float64 { return -float64(tok%16+1) / 32 }

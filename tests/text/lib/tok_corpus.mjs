// tok_corpus.mjs — deterministic tokenizer test corpus, imported by tests/text/tokenizer_parity.mjs
// (kept one folder down so tests/run.sh does not run it). Several thousand strings: multilingual prose,
// emoji/ZWJ, code, whitespace runs (spaces, tabs, \n, \r\n, Unicode spaces), digit runs,
// special-token text of every family, literal "<0x41>", contractions, random Unicode
// (BMP and astral, no surrogates/NUL), long lines, and random concatenations of all of it.

const SENTENCES = [
  'Hello, my dog is cute', 'The quick brown fox jumps over the lazy dog.', "I'm sure you'll see they've gone, isn't it? We'd LL 'S 'T",
  'Le cœur a ses raisons que la raison ne connaît point.', 'Größenwahn ist keine Lösung, Straße.', '¿Dónde está la biblioteca? ¡Olé!',
  '我们今天去公园散步，天气非常好。', '東京は日本の首都です。カタカナとひらがな。', '안녕하세요, 만나서 반갑습니다.',
  'مرحبا بالعالم، كيف حالك؟', 'שלום עולם, מה שלומך?', 'नमस्ते दुनिया, आप कैसे हैं?', 'Привет, мир! Как дела?',
  'Γειά σου Κόσμε, τι κάνεις;', 'สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง', 'Xin chào thế giới, tiếng Việt có dấu.',
  'e\u0301 café naïve coöperate Å Å ﬁ ½ ² Ⅳ ① ｆｕｌｌｗｉｄｔｈ', '👋🏽 Hello 👨‍👩‍👧‍👦 family 🇫🇷🇯🇵 flags ❤️ ✨🔥',
  'ǅemal ǈ ǋ titlecase', '٠١٢٣٤٥٦٧٨٩ ०१२३ ０１２３ 𝟘𝟙𝟚', '𝕏 𝒜 𝔘 math alnum', 'zero\u200bwidth\u200djoiner\ufeffbom',
  'A\u00a0B\u2009C\u3000D\u202fE\u2028F\u2029G\u0085H', 'tab\tseparated\tvalues\tand\t\ttabs',
];

const CODE = [
  'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  '#include <stdio.h>\nint main(void) {\n\tprintf("hi %d\\n", 42);\n\treturn 0;\n}\n',
  'const x = arr.map((v, i) => v * 2).filter(Boolean); // comment\n',
  '<table><tr><td>cell</td></tr></table> <div class="a">x</div> </iframe>',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;',
  '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b"}}',
  'fn main() { let v: Vec<u8> = vec![0xFF; 16]; println!("{:?}", v); }',
  '    indented\n        more\n\n\n\n   trailing   \n',
  'x=1;y=2;z=x**y//3%4&5|6^~7<<8>>9', '$ ls -la | grep "^d" && echo done || exit 1',
];

const SPECIAL = [
  '<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '<start_of_turn>user\nHi<end_of_turn>\n', '<unused0>', '<unused99>',
  '<start_of_image>', '<image_soft_token>', '[multimodal]', '<|im_start|>system\nYou are helpful.<|im_end|>\n',
  '<|endoftext|>', '<think>\nreasoning\n</think>', '<tool_call>{"name": "f"}</tool_call>', '<|begin_of_text|>',
  '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>', '<|reserved_special_token_5|>', '<s>', '</s>', '<s> [INST] hi [/INST]',
  '<｜begin▁of▁sentence｜>', '<｜User｜>hi<｜Assistant｜>', '<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>',
  '<0x41><0x0A>', '<0xZZ> <0x>', '<|im_start', 'im_end|>', '<<bos>>', '<bos><bos>', ' <eos> ', '\n<think>\n', '<unused0><unused1>',
  // Gemma 4
  '<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n', '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
  '<|tool_response>response:get_weather{value:<|"|>{"temp": 21}<|"|>}<tool_response|>', '<|channel>thought\nhmm<channel|>Hi',
  '<|turn>system\n<|think|>\n<|tool>declaration:f{}<tool|><turn|>', '<|image|><|audio|><|video|>', '<|"|><|"|>"', '<|turn|><turn|>>',
  // GLM-4 / GLM-5
  '[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi<|assistant|>\n<think></think>\nHello!',
  '<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call><|observation|>\n<tool_response>\n{"temp": 21}\n</tool_response><|assistant|>',
  '/nothink [MASK][sMASK]<eop><|endoftext|>', '<|user|><|user|> <|observation|>',
];

const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', '\n\n\n', '\r\n', ' \n ', '\u00a0', '\u3000', '\u2003', '\t\t\n  \n'];

function rng(seed) {
  let s = BigInt(seed) || 1n;
  return () => {
    s ^= s << 13n; s &= 0xFFFFFFFFFFFFFFFFn; s ^= s >> 7n; s ^= s << 17n; s &= 0xFFFFFFFFFFFFFFFFn;
    return Number(s % 2147483647n) / 2147483647;
  };
}

const RANGES = [
  [0x20, 0x7e, 30], [0x09, 0x0d, 3], [0xa0, 0xff, 5], [0x100, 0x24f, 4], [0x300, 0x36f, 3], [0x370, 0x3ff, 2],
  [0x400, 0x4ff, 3], [0x590, 0x5ff, 2], [0x600, 0x6ff, 3], [0x900, 0x97f, 2], [0xe00, 0xe7f, 2], [0x1100, 0x11ff, 1],
  [0x2000, 0x206f, 3], [0x2100, 0x27ff, 3], [0x3000, 0x30ff, 3], [0x4e00, 0x9fff, 5], [0xac00, 0xd7a3, 3],
  [0xe000, 0xe0ff, 1], [0xfe00, 0xfeff, 1], [0xff00, 0xffef, 2], [0x10000, 0x1007f, 1], [0x1d400, 0x1d7ff, 2],
  [0x1f300, 0x1faff, 6], [0x20000, 0x2a6df, 1], [0xe0000, 0xe007f, 1], [0x0378, 0x037f, 1], [0x0080, 0x009f, 1],
];
const RW = RANGES.reduce((a, r) => a + r[2], 0);

function randChar(r) {
  let x = r() * RW;
  for (const [lo, hi, w] of RANGES) {
    if ((x -= w) < 0) return String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
  }
  return 'a';
}

function randUnicode(r, n) {
  let s = '';
  for (let i = 0; i < n; i++) s += randChar(r);
  return s;
}

function digits(r) {
  let s = '';
  const n = 1 + Math.floor(r() * 14);
  for (let i = 0; i < n; i++) s += String(Math.floor(r() * 10));
  return s;
}

export function makeCorpus(n = 3000, seed = 12345) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const out = ['', ' ', 'a', '\n', '  leading spaces\n\nand 12345 ...', 'Hello\n\n\nworld', 'a\u0001b 𝕏 <unused0> x'];
  for (const s of [...SENTENCES, ...CODE, ...SPECIAL, ...SPACES]) out.push(s);
  const gens = [
    () => pick(SENTENCES), () => pick(CODE), () => pick(SPECIAL), () => pick(SPACES).repeat(1 + Math.floor(r() * 40)),
    () => digits(r), () => randUnicode(r, 1 + Math.floor(r() * 30)), () => pick(SENTENCES).toUpperCase(),
    () => pick(SENTENCES).split(' ').reverse().join(pick(SPACES)),
  ];
  while (out.length < n) {
    const parts = 1 + Math.floor(r() * 6);
    let s = '';
    for (let i = 0; i < parts; i++) s += pick(gens)();
    if (r() < 0.01) s = s.repeat(40); // a few long lines (several KB)
    out.push(s.replace(/\u0000/g, ''));
  }
  return out;
}

import torch, time
from labkit.models import load_model
from labkit.models.int8_linear import choose_int8_backend
from labkit.models.int8_model import Int8Model
from labkit.models.quant import quality
from labkit.workloads import sharegpt_quality_prompts
from labkit.bench.decode_sweep import labkit_decode_ms
print(torch.get_num_threads())
m=load_model("default", dtype="float32", progress=False)
b=choose_int8_backend(); print(b.reason)
prompts=sharegpt_quality_prompts(m.tokenizer, n=8)
body=Int8Model(m,b,lm_head=False); head=Int8Model(m,b,lm_head=True)
for name,c in (("body",body),("head too",head)):
    print(name, quality(m,c,prompts,32), c.weight_bytes()/1e6)
for r in range(2):
  for name,c in (("fp32",m),("body",body),("head too",head)):
    print(name, {bs: round(labkit_decode_ms(c,bs,128,6),1) for bs in (1,8,32)})

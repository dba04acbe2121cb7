#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "flashattn.h"
#include "std_attention.h"
int main(void){
  int64_t n=300,H=3,d=64; size_t c=n*H*d;
  for(int outer=0;outer<2;outer++){
  float*q=malloc(c*4),*k=malloc(c*4),*v=malloc(c*4),*o1=calloc(c,4),*o2=calloc(c,4),*dout=malloc(c*4),*dq=malloc(c*4),*dk=malloc(c*4),*dv=malloc(c*4),*lse=malloc(n*H*4);
  float*dq2=malloc(c*4),*dk2=malloc(c*4),*dv2=malloc(c*4);
  for(size_t i=0;i<c;i++){q[i]=sinf(i*0.37f);k[i]=cosf(i*0.11f);v[i]=sinf(i*0.05f+1);dout[i]=cosf(i*0.3f);}
  std_problem sp={n,H,d,outer?d:H*d,outer?n*d:d,1,2,q,k,v,dout,o1,dq,dk,dv};
  std_forward_backward(&sp);
  fa_context*ctx; fa_context_create(FA_BACKEND_CPU,0,&ctx);
  fa_attention_desc desc; fa_attention_desc_init(&desc); desc.causal=1;
  fa_tensor sh={NULL,FA_DTYPE_F32,1,n,H,d,outer?H*n*d:0,outer?d:0,outer?n*d:0};
  fa_tensor tq=sh,tk=sh,tv=sh,to=sh,tdo=sh,tdq=sh,tdk=sh,tdv=sh;
  tq.data=q;tk.data=k;tv.data=v;to.data=o2;tdo.data=dout;tdq.data=dq2;tdk.data=dk2;tdv.data=dv2;
  if(fa_forward(ctx,&desc,&tq,&tk,&tv,&to,lse)){puts(fa_last_error());return 1;}
  if(fa_backward(ctx,&desc,&tq,&tk,&tv,&to,&tdo,lse,&tdq,&tdk,&tdv)){puts(fa_last_error());return 1;}
  double e[4]={0};
  for(size_t i=0;i<c;i++){e[0]=fmax(e[0],fabs(o1[i]-o2[i]));e[1]=fmax(e[1],fabs(dq[i]-dq2[i]));e[2]=fmax(e[2],fabs(dk[i]-dk2[i]));e[3]=fmax(e[3],fabs(dv[i]-dv2[i]));}
  printf("layout %s: max |diff| out %.2e dq %.2e dk %.2e dv %.2e\n",outer?"bhnd":"bnhd",e[0],e[1],e[2],e[3]);
  }
  return 0;
}

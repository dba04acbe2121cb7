#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "cpu/kernels/kernels.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float *buf(size_t n){float*x=aligned_alloc(64,(n*4+63)/64*64);for(size_t i=0;i<n;i++)x[i]=(float)((i*2654435761u)%1000)/1000.f-0.5f;return x;}
int main(int argc,char**argv){
  const fa_cpu_kernels*k=fa_cpu_kernels_by_name("avx512");
  int d=atoi(argv[1]); int variant=atoi(argv[2]); int reps=atoi(argv[3]);
  int N=4096,H=8;
  int br=128, bc = d==128?512:1024, G=8, ld=br+16;
  int ldv = (variant&1)? d+16 : d;
  float *Kt=buf((size_t)N*H*d),*Vt=buf((size_t)N*H*d);
  float *K=buf((size_t)bc*d), *V=buf((size_t)bc*(d+16)), *st=buf((size_t)bc*ld), *mx=buf(ld), *alpha=buf(br),*shift=buf(ld),*sum=buf(ld);
  for(int i=0;i<ld;i++){alpha[i<br?i:0]=1.0f;shift[i]=0;}
  float *QT[8],*O[8]; for(int g=0;g<G;g++){QT[g]=buf((size_t)d*ld);O[g]=buf((size_t)br*d);}
  double fl=2.0*br*bc*d;
  double bst=1e9,bpv=1e9,bex=1e9,bcp=1e9;
  for(int r=0;r<reps;r++){
    double a=0,b=0,e=0,c=0;
    for(int h=0;h<H;h++) for(int j0=0;j0<N;j0+=bc){
      double t0=now();
      for(int i=0;i<bc;i++){memcpy(K+i*d,Kt+((size_t)(j0+i)*H+h)*d,d*4);memcpy(V+i*ldv,Vt+((size_t)(j0+i)*H+h)*d,d*4);}
      c+=now()-t0;
      for(int g=0;g<G;g++){
      double t0=now();
      k->gemm_max(bc,br,d,K,d,1,QT[g],ld,st,ld,mx);
      double t1=now();
      k->exp_cols(st,ld,bc,br,0.088f,mx,sum);
      double t2=now();
      if(variant&2){ int kc=(variant&4)?128:256; for(int p=0;p<bc;p+=kc)k->gemm(br,d,kc,st+p*ld,1,ld,V+p*ldv,ldv,O[g],d,p?NULL:alpha,1);}
      else k->gemm(br,d,bc,st,1,ld,V,ldv,O[g],d,alpha,1);
      double t3=now();
      a+=t1-t0;e+=t2-t1;b+=t3-t2;
    }}
    if(a<bst)bst=a; if(b<bpv)bpv=b; if(e<bex)bex=e; if(c<bcp)bcp=c;
  }
  double tot=G*fl*H*(N/bc);
  printf("d=%d variant=%d (ldv=%d%s): S^T %.1f GF/s  PV %.1f GF/s  PV/ST %.3f exp %.1f%% copy %.1f%%\n",d,variant,ldv,(variant&2)?((variant&4)?" KC128":" KC256"):"",tot/bst*1e-9,tot/bpv*1e-9,bpv/bst,100*bex/(bst+bpv+bex+bcp),100*bcp/(bst+bpv+bex+bcp));
  return 0;
}

#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu/kernels/kernels.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float *buf(size_t n){float*x=aligned_alloc(64,(n*4+63)/64*64);for(size_t i=0;i<n;i++)x[i]=(float)((i*2654435761u)%1000)/1000.f-0.5f;return x;}
int main(int argc,char**argv){
  const fa_cpu_kernels*k=fa_cpu_kernels_by_name(argc>1?argv[1]:"avx512");
  int br=128,bc=512,d=atoi(argc>2?argv[2]:"128"); if(d==64){br=128;bc=1024;}
  int lda=br+16; int rounds=atoi(argc>3?argv[3]:"5");
  float*st=buf((size_t)bc*lda), *o=buf((size_t)br*(d+16)), *alpha=buf(br);
  for(int i=0;i<br;i++)alpha[i]=1.0f;
  float*v128=buf((size_t)bc*d), *v144=buf((size_t)bc*(d+16));
  double fl=2.0*br*bc*d;
  const char*names[]={"ldv=d","ldv=d+16","ldv=d KC256","ldv=d+16 KC256","ldv=d+16 KC128","ldo=d+16,ldv=d+16"};
  double best[6]; for(int v=0;v<6;v++)best[v]=1e9;
  for(int r=0;r<rounds;r++) for(int v=0;v<6;v++){
    double b=1e9;
    for(int it=0;it<20;it++){
      double t0=now();
      switch(v){
      case 0: k->gemm(br,d,bc,st,1,lda,v128,d,o,d,alpha,1);break;
      case 1: k->gemm(br,d,bc,st,1,lda,v144,d+16,o,d,alpha,1);break;
      case 2: for(int p=0;p<bc;p+=256)k->gemm(br,d,256,st+p*lda,1,lda,v128+p*d,d,o,d,p?NULL:alpha,1);break;
      case 3: for(int p=0;p<bc;p+=256)k->gemm(br,d,256,st+p*lda,1,lda,v144+p*(d+16),d+16,o,d,p?NULL:alpha,1);break;
      case 4: for(int p=0;p<bc;p+=128)k->gemm(br,d,128,st+p*lda,1,lda,v144+p*(d+16),d+16,o,d,p?NULL:alpha,1);break;
      case 5: k->gemm(br,d,bc,st,1,lda,v144,d+16,o,d+16,alpha,1);break;
      }
      double t=now()-t0; if(t<b)b=t;
    }
    if(b<best[v])best[v]=b;
    printf("r%d %-18s %8.1f us %6.1f GFLOP/s\n",r,names[v],b*1e6,fl/b*1e-9);
  }
  return 0;
}
